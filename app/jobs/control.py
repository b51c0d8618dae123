"""What a running job sees: its progress, its cancel flag, its heartbeat and its deadline."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from app.jobs.queue import LostJob, commit_result, heartbeat
from app.store.db import Database

__all__ = ["JobControl"]

log = logging.getLogger(__name__)


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
        self.deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
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
