"""What a running job sees: its progress, its cancel flag, its heartbeat and its deadline.

The deadline (``CKA_JOB_TIMEOUT_S``) is enforced twice. The job stops at its next check
(``on_batch``, ``should_stop``) once it is past; and the runner itself, at its first heartbeat
past the deadline, ends the job's row ``failed`` (``job_timeout``) whether or not the job
reaches a check: a stage that asks nothing cannot keep a job running past its limit, and the
result it may still produce is refused (its worker no longer owns the job). Celery's own time
limits do nothing here: a worker runs its job in the solo pool (one process, the job in its
main thread), which has no time limits, so the runner enforces the same limit on every worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from app.jobs.queue import LostJob, commit_result, fail, heartbeat
from app.store.db import Database

__all__ = ["JobControl", "timeout_message"]

log = logging.getLogger(__name__)


def timeout_message(limit_s: float) -> str:
    """The error of a job stopped by its time limit."""
    return (
        f"the job ran longer than CKA_JOB_TIMEOUT_S ({limit_s:g} s) and was stopped; raise the "
        "limit or submit a smaller job"
    )


class JobControl:
    """Report progress, learn about cancellation, keep alive.

    A daemon thread writes the heartbeat and the latest progress every ``interval`` seconds,
    so a long batch never makes the job look stale, and reads the cancel flag back. A failed
    beat (the database away) is logged in one line and tried again at the next one; it never
    stops the job. ``shutdown`` is the worker's stop event: when set, the job stops at its
    next batch so the worker can give it back to the queue.
    """

    def __init__(
        self,
        db: Database,
        job_id: int,
        worker_id: str,
        interval: float,
        shutdown: threading.Event | None = None,
        retry_timeout: float = 60.0,
        time_limit_s: float | None = None,
        progress: float = 0.0,
    ) -> None:
        self.db = db
        self.job_id = job_id
        self.worker_id = worker_id
        self.retry_timeout = retry_timeout
        self.interval = interval
        # where the job stands: 0 when claimed, its shards' share when taken back after them
        self.progress = progress
        self.cancel_requested = False
        self.lost = False
        self.shutdown = shutdown or threading.Event()
        self.time_limit_s = time_limit_s
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        # True once the runner ended the row at the deadline (see the module docstring)
        self.expired = False
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> JobControl:
        self.flush()  # a cancel that arrived between claim and start is seen at once
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()
            if self.timed_out and not self.expired and not self.lost:
                self._expire()

    def _expire(self) -> None:
        """The runner's cancel at the deadline: the row ends failed now (the job's thread, if
        it is inside a stage that asks nothing, finds the job gone when it next looks)."""
        assert self.time_limit_s is not None
        message = timeout_message(self.time_limit_s)
        try:
            ended = fail(
                self.db,
                self.job_id,
                self.worker_id,
                message,
                "job_timeout",
                timeout=self.interval,
                event="stopped by its runner: CKA_JOB_TIMEOUT_S passed",
            )
        except Exception as exc:  # the database is away: the next beat tries again
            log.warning("job %s: could not end it at its time limit (%s)", self.job_id, exc)
            return
        self.expired = True
        if ended:
            log.warning("job %s failed: %s", self.job_id, message)

    def flush(self) -> None:
        try:
            self.cancel_requested = heartbeat(self.db, self.job_id, self.worker_id, self.progress)
        except LostJob:
            self.lost = True
        except Exception as exc:  # a database hiccup must not kill the job; the next beat retries
            if not self._failing:  # one line per outage, not one traceback per beat
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning("heartbeat of job %s failed (%s); retrying", self.job_id, first)
            self._failing = True
        else:
            if self._failing:
                log.info("heartbeat of job %s is back", self.job_id)
            self._failing = False

    def commit(self, write: Callable[[Session], None]) -> None:
        """:func:`~app.jobs.queue.commit_result` for this job: succeeded, and ``write`` its
        result, once."""
        commit_result(self.db, self.job_id, self.worker_id, write, timeout=self.retry_timeout)

    def on_batch(self, done: int, total: int) -> bool:
        """The ``on_batch`` / ``on_step`` callback of the libraries; False stops the job."""
        self.progress = done / total if total else 1.0
        return not (self.should_stop or self.shutdown.is_set())

    @property
    def timed_out(self) -> bool:
        """Past ``time_limit_s`` (``CKA_JOB_TIMEOUT_S``): the job stops at its next batch or
        training step and fails, on any worker."""
        return self.deadline is not None and time.monotonic() > self.deadline

    @property
    def should_stop(self) -> bool:
        return self.cancel_requested or self.lost or self.timed_out
