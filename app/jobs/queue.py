"""The job state machine: every transition of a ``jobs`` row, as a compare-and-set.

States (:class:`app.store.orm.JobState`): ``queued -> running -> succeeded | failed |
cancelled``, and ``running -> queued`` when a worker's heartbeat goes stale
(:mod:`app.jobs.reaper`) or its worker shuts down. Every transition is an ``UPDATE`` guarded by
the expected state (and, once running, by the owning worker id): :func:`compare_and_set`, which
the reaper and the cancel write theirs with too. So two workers can never both run one job and
a worker that lost its job cannot write a result: the result is written in the same transaction
as the ``succeeded`` transition, and that transition only matches while this worker still owns
the job. A running job may also be parked while its children run
(:mod:`app.jobs.parking`): :func:`park` hands it to them, :func:`take_over` takes it back.
Cancelling (who may, and when a shared job stops) is :mod:`app.jobs.cancel`'s.

A cancel that was answered wins: the ``succeeded`` transition also requires that no cancel was
requested, so a job whose cancel was committed before its result ends ``cancelled``
(:class:`CancelRequested`), never ``succeeded``; the two transactions take the job's row lock
in turn (PostgreSQL re-reads the row the other one committed), and the one that commits first
decides. Writes that touch a job and its parents lock them top-down (:mod:`app.jobs.parking`).

Every run of a job that ends other than by succeeding leaves a line in its history
(``detail["history"]``, the latest :data:`HISTORY_KEPT`): given back to the queue (its worker
was stopped, the database was lost), re-queued by the reaper, stopped by its time limit,
cancelled at a check. A job's own record of what happened to it, read with the job.

The database may go away for a while (a restart, a lost connection): the end-of-job writes are
retried with backoff (:func:`app.store.db.retry`), so a finished result is not lost and is
written once.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.jobs.parking import PARKED, beat_parent, is_parked, lock_ancestors
from app.store.db import Database, retry
from app.store.orm import Job, JobState, utcnow
from app.store.settings import Settings

__all__ = [
    "HISTORY_KEPT",
    "CancelRequested",
    "LostJob",
    "claim",
    "commit_result",
    "compare_and_set",
    "complete",
    "enqueue",
    "fail",
    "give_back_owned",
    "heartbeat",
    "mark_cancelled",
    "new_worker_id",
    "park",
    "queued",
    "queued_ids",
    "release",
    "retry_s",
    "take_over",
    "with_history",
]

# The latest entries of a job's history that its row keeps.
HISTORY_KEPT = 20


class LostJob(RuntimeError):
    """This worker no longer owns the job (it was re-queued or cancelled)."""


def compare_and_set(session: Session, where: Any, **values: Any) -> bool:
    """Write ``values`` to the one job ``where`` selects, in the caller's transaction; whether
    it matched. ``where`` names the job and the state it is expected in (:func:`queued`, a
    worker's own running job, a parked one), so a job that moved on first — claimed by another
    worker, cancelled, re-queued by the reaper — is left as it is and False comes back."""
    res = session.execute(
        update(Job).where(where).values(**values).execution_options(synchronize_session=False)
    )
    return bool(res.rowcount == 1)  # type: ignore[attr-defined]


def queued(job_id: int) -> Any:
    """The guard of a job that is still queued: nobody has claimed or cancelled it yet."""
    return (Job.id == job_id) & (Job.status == JobState.QUEUED)


class CancelRequested(RuntimeError):
    """The job's result came after a cancel that was answered: it ends cancelled instead."""


def with_history(
    detail: Mapping[str, Any] | None, event: str, worker: str | None
) -> dict[str, Any]:
    """``detail`` with one more history entry (when, which worker, what happened)."""
    entry = {"at": utcnow().isoformat(timespec="seconds"), "worker": worker, "event": event}
    history = [*((detail or {}).get("history") or []), entry][-HISTORY_KEPT:]
    return {**(detail or {}), "history": history}


def new_worker_id(kind: str) -> str:
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def enqueue(
    session: Session,
    kind: str,
    *,
    parent_id: int | None = None,
    shard: int | None = None,
    detail: dict[str, Any] | None = None,
) -> Job:
    """Add a queued job in the caller's transaction (a child names its parent; a shard its
    index)."""
    job = Job(
        kind=kind,
        status=JobState.QUEUED,
        progress=0.0,
        cancel_requested=False,
        attempts=0,
        parent_id=parent_id,
        shard=shard,
        detail=detail,
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
            if compare_and_set(
                s,
                queued(jid),
                status=JobState.RUNNING,
                worker_id=worker_id,
                started_at=now,
                heartbeat_at=now,
                progress=0.0,
                attempts=Job.attempts + 1,
                error=None,
                error_code=None,
            ):
                return s.get(Job, jid)
    return None


def _owned(job_id: int, worker_id: str) -> Any:
    return (Job.id == job_id) & (Job.status == JobState.RUNNING) & (Job.worker_id == worker_id)


def heartbeat(db: Database, job_id: int, worker_id: str, progress: float) -> bool:
    """Record liveness and progress; returns whether cancellation was requested."""
    with db.session() as s:
        lock_ancestors(s, job_id)  # its parents are updated below: top-down, as a cancel does
        beat = {"heartbeat_at": utcnow(), "progress": min(max(progress, 0.0), 1.0)}
        if not compare_and_set(s, _owned(job_id, worker_id), **beat):
            raise LostJob(f"job {job_id} is no longer owned by {worker_id}")
        cancel, parent = s.execute(
            select(Job.cancel_requested, Job.parent_id).where(Job.id == job_id)
        ).one()
        if parent is not None:
            beat_parent(s, parent)
        return bool(cancel)


def park(db: Database, job_id: int, worker_id: str, **values: Any) -> bool:
    """Hand a running job this worker owns to its children; False if it is no longer ours.

    ``values`` are written with it (a study's progress plan in ``detail``, say).
    """
    return _set(db, job_id, worker_id, 10.0, worker_id=PARKED, heartbeat_at=utcnow(), **values)


def take_over(db: Database, job_id: int, worker_id: str) -> Job | None:
    """Take a parked job back from its children for this worker (at most one worker wins)."""
    with db.session() as s:
        taken = compare_and_set(s, is_parked(job_id), worker_id=worker_id, heartbeat_at=utcnow())
        return s.get(Job, job_id) if taken else None


def complete(session: Session, job_id: int, worker_id: str) -> None:
    """Mark succeeded inside the caller's transaction (which also writes the result).

    Only while no cancel was requested: a job cancelled before this commits is
    :class:`CancelRequested` (the caller ends it cancelled), whatever it computed.
    """
    lock_ancestors(session, job_id)
    if not compare_and_set(
        session,
        _owned(job_id, worker_id) & Job.cancel_requested.is_(False),
        status=JobState.SUCCEEDED,
        progress=1.0,
        finished_at=utcnow(),
        heartbeat_at=utcnow(),
        error=None,
    ):
        cancelled = session.scalar(select(Job.cancel_requested).where(_owned(job_id, worker_id)))
        if cancelled:
            raise CancelRequested(f"job {job_id} was cancelled before its result was written")
        raise LostJob(f"job {job_id} is no longer owned by {worker_id}; result discarded")
    parent = session.scalar(select(Job.parent_id).where(Job.id == job_id))
    if parent is not None:  # its parent's progress counts this child whole at once
        beat_parent(session, parent)


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


def _set(
    db: Database, job_id: int, owner: str, timeout: float, event: str | None = None, **values: Any
) -> bool:
    """A compare-and-set of the job ``owner`` runs, with ``event`` added to its history."""

    def once() -> bool:
        with db.session() as s:
            changes = dict(values)
            if event is not None:
                detail = s.scalar(select(Job.detail).where(_owned(job_id, owner)))
                changes["detail"] = with_history(detail, event, owner)
            return compare_and_set(s, _owned(job_id, owner), **changes)

    return retry(once, timeout=timeout, what=f"recording the outcome of job {job_id}")


def fail(
    db: Database,
    job_id: int,
    worker_id: str,
    error: str,
    code: str,
    timeout: float = 60.0,
    event: str | None = None,
) -> bool:
    """Failed with ``error`` (one sentence) and ``code``; ``event`` for its history."""
    return _set(
        db,
        job_id,
        worker_id,
        timeout,
        event,
        status=JobState.FAILED,
        error=error[:4000],
        error_code=code,
        finished_at=utcnow(),
    )


def mark_cancelled(
    db: Database, job_id: int, worker_id: str, timeout: float = 60.0, progress: float | None = None
) -> bool:
    """Cancelled, at the check where it stopped (``progress``, for its history)."""
    at = "" if progress is None else f" at {progress:.0%}"
    return _set(
        db,
        job_id,
        worker_id,
        timeout,
        f"stopped by its cancel{at}",
        status=JobState.CANCELLED,
        error_code="cancelled",
        finished_at=utcnow(),
    )


def release(db: Database, job_id: int, worker_id: str, why: str, timeout: float = 10.0) -> bool:
    """Give a running job back to the queue; ``why`` (its worker is stopping, the database
    went away) goes into its history."""
    return _set(
        db,
        job_id,
        worker_id,
        timeout,
        f"given back to the queue: {why}",
        status=JobState.QUEUED,
        worker_id=None,
        progress=0.0,
    )


def give_back_owned(db: Database, worker_ids: list[str], why: str) -> list[int]:
    """End the runs these workers still own (their threads did not stop in time): a job whose
    cancel was requested ends cancelled, any other goes back to the queue; ``why`` in its
    history. The ids given back to the queue."""
    if not worker_ids:
        return []
    with db.session(readonly=True) as s:
        rows = list(
            s.execute(
                select(Job.id, Job.worker_id, Job.cancel_requested).where(
                    Job.status == JobState.RUNNING, Job.worker_id.in_(worker_ids)
                )
            )
        )
    requeued = []
    for job_id, owner, cancelled in rows:
        if cancelled:
            mark_cancelled(db, job_id, str(owner), timeout=10.0)
        elif release(db, job_id, str(owner), why):
            requeued.append(job_id)
    return requeued


def retry_s(settings: Settings) -> float:
    """How long a finished job keeps retrying its final write while the database is away.

    Past the stale horizon another worker may have re-queued the job, and the write would be
    refused anyway.
    """
    return max(settings.stale_after_s, 10.0)
