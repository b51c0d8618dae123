"""The job state machine and its queries; ``jobs`` rows are the source of truth for work.

States: ``queued -> running -> succeeded | failed | cancelled``, and ``running -> queued``
when a worker's heartbeat goes stale or its worker shuts down. Every transition is a
compare-and-set ``UPDATE`` guarded by the expected state (and, once running, by the owning
worker id), so two workers can never both run one job and a worker that lost its job
cannot write a result: the result is written in the same transaction as the ``succeeded``
transition, and that transition only matches while this worker still owns the job.

A sharded comparison (:mod:`app.jobs.shards`) parks its job while its shards run: the job
stays ``running`` but is owned by :data:`SHARD_OWNER` rather than a worker, every shard's
heartbeat refreshes it and sets its progress to the shards' mean, and the worker that ends the
last shard takes it back (:func:`take_over`, a compare-and-set, so only one does) to combine
them. A cancel reaches every shard; the stale reaper never re-queues a parked job while a
shard may still run, and re-queues it once they have all ended and nobody took it over; when
no shard has beaten for the stale horizon, it sends the queued ones to the workers again.

The database may go away for a while (a restart, a lost connection): heartbeats then fail
and are tried again at the next beat, and the end-of-job writes are retried with backoff
(:func:`app.store.db.retry`), so a finished result is not lost and is written once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.store.db import Database, retry
from app.store.orm import Job, JobState, utcnow
from app.store.settings import Settings

__all__ = [
    "SHARD_OWNER",
    "JobControl",
    "LostJob",
    "Parked",
    "claim",
    "commit_result",
    "complete",
    "enqueue",
    "fail",
    "mark_cancelled",
    "new_worker_id",
    "park",
    "queued_ids",
    "release",
    "request_cancel",
    "requeue_stale",
    "retry_s",
    "shards_left",
    "take_over",
]

log = logging.getLogger(__name__)

# The owner of a parked comparison job while its shards run (never a worker id: those have
# three colons).
SHARD_OWNER = "shards"


class LostJob(RuntimeError):
    """This worker no longer owns the job (it was re-queued or cancelled)."""


class Parked(Exception):
    """The job was handed to its shards (see :func:`park`); it ends when they do."""


def new_worker_id(kind: str) -> str:
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def enqueue(
    session: Session, kind: str, *, parent_id: int | None = None, shard: int | None = None
) -> Job:
    """Add a queued job in the caller's transaction (a shard names its parent and index)."""
    job = Job(
        kind=kind,
        status=JobState.QUEUED,
        progress=0.0,
        cancel_requested=False,
        attempts=0,
        parent_id=parent_id,
        shard=shard,
    )
    session.add(job)
    session.flush()
    return job


def queued_ids(db: Database, limit: int = 100) -> list[int]:
    with db.session(readonly=True) as s:
        stmt = select(Job.id).where(Job.status == JobState.QUEUED).order_by(Job.id).limit(limit)
        return list(s.scalars(stmt))


def claim(db: Database, worker_id: str, job_id: int | None = None) -> Job | None:
    """Move one queued job (``job_id`` or the oldest) to running for this worker."""
    with db.session() as s:
        if job_id is not None:
            candidates = [job_id]
        else:
            stmt = select(Job.id).where(Job.status == JobState.QUEUED).order_by(Job.id).limit(8)
            candidates = list(s.scalars(stmt))
        now = utcnow()
        for jid in candidates:
            res = s.execute(
                update(Job)
                .where(Job.id == jid, Job.status == JobState.QUEUED)
                .values(
                    status=JobState.RUNNING,
                    worker_id=worker_id,
                    started_at=now,
                    heartbeat_at=now,
                    progress=0.0,
                    attempts=Job.attempts + 1,
                    error=None,
                    error_code=None,
                )
                .execution_options(synchronize_session=False)
            )
            if res.rowcount == 1:  # type: ignore[attr-defined]
                return s.get(Job, jid)
    return None


def _owned(job_id: int, worker_id: str) -> Any:
    return (Job.id == job_id) & (Job.status == JobState.RUNNING) & (Job.worker_id == worker_id)


def heartbeat(db: Database, job_id: int, worker_id: str, progress: float) -> bool:
    """Record liveness and progress; returns whether cancellation was requested."""
    with db.session() as s:
        res = s.execute(
            update(Job)
            .where(_owned(job_id, worker_id))
            .values(heartbeat_at=utcnow(), progress=min(max(progress, 0.0), 1.0))
            .execution_options(synchronize_session=False)
        )
        if res.rowcount != 1:  # type: ignore[attr-defined]
            raise LostJob(f"job {job_id} is no longer owned by {worker_id}")
        cancel, parent = s.execute(
            select(Job.cancel_requested, Job.parent_id).where(Job.id == job_id)
        ).one()
        if parent is not None:
            _beat_parent(s, parent)
        return bool(cancel)


def _beat_parent(session: Session, parent_id: int) -> None:
    """Keep a parked comparison alive, its progress the mean of its shards'."""
    mean = select(func.avg(Job.progress)).where(Job.parent_id == parent_id).scalar_subquery()
    session.execute(
        update(Job)
        .where(_parked(parent_id))
        .values(heartbeat_at=utcnow(), progress=func.coalesce(mean, 0.0))
        .execution_options(synchronize_session=False)
    )


def _parked(job_id: int) -> Any:
    return (Job.id == job_id) & (Job.status == JobState.RUNNING) & (Job.worker_id == SHARD_OWNER)


def park(db: Database, job_id: int, worker_id: str) -> bool:
    """Hand a running job this worker owns to its shards; False if it is no longer ours."""
    return _set(db, job_id, worker_id, 10.0, worker_id=SHARD_OWNER, heartbeat_at=utcnow())


def take_over(db: Database, job_id: int, worker_id: str) -> Job | None:
    """Take a parked job back from its shards for this worker (at most one worker wins)."""
    with db.session() as s:
        res = s.execute(
            update(Job)
            .where(_parked(job_id))
            .values(worker_id=worker_id, heartbeat_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return s.get(Job, job_id) if res.rowcount == 1 else None  # type: ignore[attr-defined]


def complete(session: Session, job_id: int, worker_id: str) -> None:
    """Mark succeeded inside the caller's transaction (which also writes the result)."""
    res = session.execute(
        update(Job)
        .where(_owned(job_id, worker_id))
        .values(
            status=JobState.SUCCEEDED, progress=1.0, finished_at=utcnow(), heartbeat_at=utcnow()
        )
        .execution_options(synchronize_session=False)
    )
    if res.rowcount != 1:  # type: ignore[attr-defined]
        raise LostJob(f"job {job_id} is no longer owned by {worker_id}; result discarded")


def commit_result(
    db: Database,
    job_id: int,
    worker_id: str,
    write: Callable[[Session], None],
    *,
    timeout: float,
) -> None:
    """Mark the job succeeded and ``write`` its result in one transaction, retried.

    A retry after a commit whose acknowledgement was lost finds the job already succeeded by
    this worker and stops there, so the result is written exactly once. Raises
    :class:`LostJob` when the job is no longer this worker's.
    """
    attempts = 0

    def once() -> None:
        nonlocal attempts
        attempts += 1
        with db.session() as s:
            if attempts > 1:
                row = s.execute(select(Job.status, Job.worker_id).where(Job.id == job_id)).first()
                if row is not None and tuple(row) == (JobState.SUCCEEDED, worker_id):
                    return
            complete(s, job_id, worker_id)
            write(s)

    retry(once, timeout=timeout, what=f"writing the result of job {job_id}")


def _set(db: Database, job_id: int, owner: str, timeout: float, **values: Any) -> bool:
    def once() -> bool:
        with db.session() as s:
            res = s.execute(
                update(Job)
                .where(_owned(job_id, owner))
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            return res.rowcount == 1  # type: ignore[attr-defined]

    return retry(once, timeout=timeout, what=f"recording the outcome of job {job_id}")


def fail(
    db: Database, job_id: int, worker_id: str, error: str, code: str, timeout: float = 60.0
) -> bool:
    return _set(
        db,
        job_id,
        worker_id,
        timeout,
        status=JobState.FAILED,
        error=error[:4000],
        error_code=code,
        finished_at=utcnow(),
    )


def mark_cancelled(db: Database, job_id: int, worker_id: str, timeout: float = 60.0) -> bool:
    return _set(
        db,
        job_id,
        worker_id,
        timeout,
        status=JobState.CANCELLED,
        error_code="cancelled",
        finished_at=utcnow(),
    )


def release(db: Database, job_id: int, worker_id: str, timeout: float = 10.0) -> bool:
    """Give a running job back to the queue (its worker is shutting down)."""
    return _set(
        db, job_id, worker_id, timeout, status=JobState.QUEUED, worker_id=None, progress=0.0
    )


def request_cancel(session: Session, job_id: int) -> None:
    """Cancel a queued job at once; ask a running one to stop at its next batch.

    The shards of a sharded comparison are cancelled with it; a parked comparison none of
    whose shards still runs is cancelled at once.
    """
    now = utcnow()
    for target in (Job.id == job_id, Job.parent_id == job_id):
        _cancel_where(session, target, now)
    if not _live_shards(session, job_id):
        session.execute(
            update(Job)
            .where(_parked(job_id))
            .values(status=JobState.CANCELLED, finished_at=now, error_code="cancelled")
            .execution_options(synchronize_session=False)
        )
    session.expire_all()


def _cancel_where(session: Session, target: Any, now: Any) -> None:
    session.execute(
        update(Job)
        .where(target, Job.status == JobState.QUEUED)
        .values(
            status=JobState.CANCELLED,
            cancel_requested=True,
            finished_at=now,
            error_code="cancelled",
        )
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(Job)
        .where(target, Job.status == JobState.RUNNING)
        .values(cancel_requested=True)
        .execution_options(synchronize_session=False)
    )


def requeue_stale(db: Database, stale_after_s: float, max_attempts: int = 5) -> list[int]:
    """Put running jobs whose heartbeat is older than ``stale_after_s`` back in the queue.

    A stale job already started ``max_attempts`` times is failed instead: its worker keeps
    dying on it (killed for memory, say), and running it again would kill the next one.
    Parked comparisons follow the rules in the module docstring. Returns the ids to send to
    the workers again: those put back in the queue, and the queued shards of a comparison
    none of whose shards has beaten for ``stale_after_s``.
    """
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    requeued: list[int] = []
    given_up: list[int] = []
    resend: list[int] = []
    with db.session() as s:
        stmt = select(Job.id, Job.attempts, Job.worker_id, Job.parent_id).where(
            Job.status == JobState.RUNNING, Job.heartbeat_at < cutoff
        )
        for jid, attempts, owner, parent in list(s.execute(stmt)):
            if owner == SHARD_OWNER:
                # Parked, and no shard has beaten for stale_after_s. With shards left, send the
                # queued ones again (a message dies with a worker killed between taking it and
                # claiming the job) and wait another stale_after_s; with none left, re-run the
                # comparison to settle it.
                if _live_shards(s, jid):
                    resend.extend(s.scalars(select(Job.id).where(_queued_shard(jid))))
                    _beat_parent(s, jid)
                    continue
                attempts = 0
            give_up = attempts >= max_attempts
            if give_up:
                values: dict[str, Any] = {
                    "status": JobState.FAILED,
                    "error": f"the worker running this job stopped responding {attempts} "
                    "times (killed, perhaps for lack of memory); it is not retried again — "
                    "try a smaller batch size or fewer models, then submit it with force",
                    "error_code": "worker_lost",
                    "finished_at": utcnow(),
                }
            else:
                values = {"status": JobState.QUEUED, "worker_id": None, "progress": 0.0}
            res = s.execute(
                update(Job)
                .where(Job.id == jid, Job.status == JobState.RUNNING, Job.heartbeat_at < cutoff)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount == 1:  # type: ignore[attr-defined]
                (given_up if give_up else requeued).append(jid)
                if give_up and parent is not None:  # its comparison cannot finish either
                    s.execute(
                        update(Job)
                        .where(_parked(parent))
                        .values(**values)
                        .execution_options(synchronize_session=False)
                    )
    if requeued:
        log.warning("re-queued stale jobs %s", requeued)
    if given_up:
        log.error("failed stale jobs %s after %d attempts each", given_up, max_attempts)
    if resend:
        log.warning("sending queued shards %s again: none of their siblings is running", resend)
    return requeued + [j for j in resend if j not in requeued]


def _live_shards(session: Session, parent_id: int) -> int:
    live = (JobState.QUEUED, JobState.RUNNING)
    stmt = select(func.count()).where(Job.parent_id == parent_id, Job.status.in_(live))
    return int(session.scalar(stmt) or 0)


def _queued_shard(parent_id: int) -> Any:
    return (Job.parent_id == parent_id) & (Job.status == JobState.QUEUED)


def shards_left(db: Database, parent_id: int) -> int:
    """How many shards of a comparison job are still queued or running."""
    with db.session(readonly=True) as s:
        return _live_shards(s, parent_id)


class JobControl:
    """What a running job sees: report progress, learn about cancellation, keep alive.

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
    ) -> None:
        self.db = db
        self.job_id = job_id
        self.worker_id = worker_id
        self.retry_timeout = retry_timeout
        self.interval = interval
        self.progress = 0.0
        self.cancel_requested = False
        self.lost = False
        self.shutdown = shutdown or threading.Event()
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
        """:func:`commit_result` for this job: succeeded, and ``write`` its result, once."""
        commit_result(self.db, self.job_id, self.worker_id, write, timeout=self.retry_timeout)

    def on_batch(self, done: int, total: int) -> bool:
        """The ``on_batch`` callback for :func:`analysis.compare`; False stops the job."""
        self.progress = done / total if total else 1.0
        return not (self.should_stop or self.shutdown.is_set())

    @property
    def should_stop(self) -> bool:
        return self.cancel_requested or self.lost


def retry_s(settings: Settings) -> float:
    """How long a finished job keeps retrying its final write while the database is away.

    Past the stale horizon another worker may have re-queued the job, and the write would be
    refused anyway.
    """
    return max(settings.stale_after_s, 10.0)
