"""Who holds a job, and cancelling one: a cancel withdraws one requester's interest.

A deduplicated job is shared: identical comparison requests get one job, and a study adopts
an identical comparison that is already queued or running. Every requester has a row in
``job_requesters`` (:class:`~app.store.orm.JobRequester`): a token (``token:ID``,
``env:DIGEST`` for one of ``CKA_API_TOKENS``), ``anonymous`` when the service has no tokens
(the laptop mode: one person, one requester), ``cli:USER`` for ``cka-atlas study run``, or a
study (``study:ID``) whose atlas the job is. A job that is part of another (a comparison's
shard, a study's training) has no row: the job it belongs to holds it.

:func:`cancel` as requester R withdraws R's interest where R holds the job: directly; through
a study R asked for (that study is cancelled for R); for a shard or a study's training,
through the job it belongs to. A job stops — at once if queued, at its next batch if
running — only when no requester still holds it (:func:`stop`); the work under it goes with
it, except a job someone else still holds (a study's atlas another user asked for too), which
is detached and carries on. A requester that holds nothing of the job is refused (403), unless
it is an admin: an admin's cancel of a job it does not hold, or with ``everyone``, stops the
job for every requester. The stopped job's ``error`` says who stopped it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from app.errors import ProblemError
from app.jobs.parking import is_parked, live_children, lock_ancestors
from app.jobs.queue import compare_and_set, queued
from app.store.orm import Job, JobRequester, JobState, Study, utcnow

__all__ = [
    "ANONYMOUS",
    "Requester",
    "cancel",
    "lock_job",
    "record",
    "request_cancel",
    "stop",
    "study_requester",
]

# The one requester of a service without tokens: nobody can be told apart from anybody.
ANONYMOUS = "anonymous"
_MAX_DEPTH = 8  # a study's atlas's shard is three jobs deep; anything deeper is a loop


@dataclass(frozen=True)
class Requester:
    """Who asks for or cancels a job: ``id`` as stored, a ``label`` for people (a token's
    name), and whether it may cancel any job (an admin token, or no tokens at all)."""

    id: str
    label: str | None = None
    admin: bool = False

    def describe(self) -> str:
        return f"{self.id} ({self.label})" if self.label else self.id


def study_requester(study: Study) -> Requester:
    return Requester(f"study:{study.id}", study.name)


def lock_job(session: Session, job_id: int) -> Job | None:
    """The job row, locked until the transaction ends (PostgreSQL; SQLite's writers queue
    anyway), after its ancestors (top-down, as a worker's heartbeat takes them: see
    :mod:`app.jobs.parking`): a request that joins a job and a cancel that stops it take turns."""
    lock_ancestors(session, job_id)
    return session.scalar(select(Job).where(Job.id == job_id).with_for_update())


def record(session: Session, job_id: int, requester: Requester) -> None:
    """Add ``requester``'s interest in a job (again, if it had withdrawn), in the caller's
    transaction, which should hold :func:`lock_job`."""
    row = session.get(JobRequester, (job_id, requester.id))
    if row is None:
        session.add(JobRequester(job_id=job_id, requester=requester.id, label=requester.label))
        session.flush()
    elif row.withdrawn_at is not None:
        row.withdrawn_at = None


def _rows(session: Session, job_id: int) -> list[JobRequester]:
    return list(session.scalars(select(JobRequester).where(JobRequester.job_id == job_id)))


def _held(session: Session, job_id: int) -> bool:
    """Whether some requester still wants the job."""
    active = (JobRequester.job_id == job_id) & JobRequester.withdrawn_at.is_(None)
    return bool(session.scalar(select(exists().where(active))))


def _held_by(session: Session, job_id: int, requester: str, depth: int = 0) -> list[int]:
    """The jobs, this one or one it belongs to, where ``requester`` has its own row."""
    if depth > _MAX_DEPTH:
        return []
    rows = _rows(session, job_id)
    if any(r.requester == requester for r in rows):
        return [job_id]
    found: list[int] = []
    for r in rows:
        if r.requester.startswith("study:") and r.withdrawn_at is None:
            study_job = session.scalar(
                select(Study.job_id).where(Study.id == int(r.requester.partition(":")[2]))
            )
            if study_job is not None:
                found += _held_by(session, study_job, requester, depth + 1)
    if not rows:
        parent = session.scalar(select(Job.parent_id).where(Job.id == job_id))
        if parent is not None:
            found += _held_by(session, parent, requester, depth + 1)
    return found


def cancel(
    session: Session, job_id: int, who: Requester, *, what: str, everyone: bool = False
) -> None:
    """Withdraw ``who``'s interest in the job (see the module docstring); ``what`` names it
    in a refusal ("comparison 7"). ``everyone`` (an admin only) stops it for every requester.
    """
    lock_job(session, job_id)
    if everyone:
        if not who.admin:
            raise ProblemError(
                403,
                "forbidden",
                f"only an admin token may cancel {what} for everyone",
                field="everyone",
            )
        stop(session, job_id, f"cancelled by an admin, {who.describe()}, for every requester")
        return
    holding = _held_by(session, job_id, who.id)
    if not holding:
        if not who.admin:
            raise ProblemError(
                403,
                "forbidden",
                f"{what} was not requested by this token nor by a study it owns; a token may "
                "cancel what it (or its study) requested, an admin token anything",
                field="Authorization",
            )
        stop(session, job_id, f"cancelled by an admin, {who.describe()}")
        return
    now = utcnow()
    for held in dict.fromkeys(holding):
        lock_job(session, held)
        session.execute(
            update(JobRequester)
            .where(
                JobRequester.job_id == held,
                JobRequester.requester == who.id,
                JobRequester.withdrawn_at.is_(None),
            )
            .values(withdrawn_at=now)
            .execution_options(synchronize_session=False)
        )
        if not _held(session, held):
            stop(session, held, f"cancelled by {who.describe()}, its last requester")
    session.expire_all()


def request_cancel(session: Session, job_id: int) -> None:
    """Stop a job for everyone, on this machine's authority (``cka-atlas``, tests)."""
    lock_job(session, job_id)
    stop(session, job_id, "cancelled")


def stop(session: Session, job_id: int, reason: str) -> None:
    """Cancel a queued job at once; ask a running one to stop at its next batch.

    Every requester's interest is withdrawn. The work under it goes with it: its children (a
    comparison's shards, a study's trainings and atlas, and theirs), and what a stopped study
    waited for — except a job another requester still holds, which is detached and carries
    on. A parked job none of whose children still runs is cancelled at once. ``reason`` is
    the job's ``error``; the work stopped with it says so.
    """
    now = utcnow()
    family: dict[int, str] = {}
    _collect(session, job_id, reason, family, now)
    for jid, why in family.items():
        _cancel_one(session, jid, why, now)
    for jid in reversed(family):  # the deepest first, so a parent sees its children ended
        if not live_children(session, jid):
            stopped = {"status": JobState.CANCELLED, "finished_at": now, "error_code": "cancelled"}
            compare_and_set(session, is_parked(jid), **stopped)
    session.expire_all()


def _collect(
    session: Session, job_id: int, reason: str, family: dict[int, str], now: datetime
) -> None:
    """The jobs that stop with ``job_id`` (into ``family``, parents first), detaching the
    children someone else still holds."""
    if job_id in family or len(family) > 100_000:
        return
    family[job_id] = reason
    _withdraw_all(session, [JobRequester.job_id == job_id], now)
    with_it = f"cancelled with job {job_id}"
    study_id = session.scalar(select(Study.id).where(Study.job_id == job_id))
    if study_id is not None:  # what the study asked for, beyond its own children
        waited = _withdraw_all(session, [JobRequester.requester == f"study:{study_id}"], now)
        for other in waited:
            if not _held(session, other):
                _collect(session, other, with_it, family, now)
    for child in list(session.scalars(select(Job.id).where(Job.parent_id == job_id))):
        if _held(session, child):  # someone else's too: it carries on without this parent
            compare_and_set(session, Job.id == child, parent_id=None)
        else:
            _collect(session, child, with_it, family, now)


def _withdraw_all(session: Session, where: Sequence[Any], now: datetime) -> list[int]:
    """Withdraw the interest of the rows ``where`` selects; the jobs they were on."""
    active = [*where, JobRequester.withdrawn_at.is_(None)]
    jobs = list(dict.fromkeys(session.scalars(select(JobRequester.job_id).where(*active))))
    if jobs:
        session.execute(
            update(JobRequester)
            .where(*active)
            .values(withdrawn_at=now)
            .execution_options(synchronize_session=False)
        )
    return jobs


def _cancel_one(session: Session, job_id: int, reason: str, now: datetime) -> None:
    """Cancel the job now if it is still queued, else ask it to stop if it is running."""
    compare_and_set(
        session,
        queued(job_id),
        status=JobState.CANCELLED,
        cancel_requested=True,
        finished_at=now,
        error=reason,
        error_code="cancelled",
    )
    running = (Job.id == job_id) & (Job.status == JobState.RUNNING)
    compare_and_set(session, running, cancel_requested=True, error=reason)
