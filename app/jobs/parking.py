"""Parked jobs: a parent that waits, owned by nobody, while its child jobs run.

A sharded comparison parks while its shards run (:mod:`app.jobs.shards`); a study parks while
its trainings and then its atlas run (:mod:`app.jobs.study`). A parked job stays ``running``
but its owner is :data:`PARKED` rather than a worker id. Every child's heartbeat refreshes it
and sets its progress from the children's (:func:`beat_parent`), and the worker that ends the
last live child takes it back (:func:`app.jobs.queue.take_over`, a compare-and-set, so only
one does) to carry on. A parked job may also wait for jobs that are not its children (a
study for an atlas another study queued first): their ids are in its ``detail``
(:data:`WAITS_FOR`, see :func:`jobs_left`), and the worker that ends one of them wakes it
too. A cancel reaches every descendant; the stale reaper (:mod:`app.jobs.reaper`) never
re-queues a parked job while anything it waits for may still run.

Locks go top-down. A child's heartbeat and its final write update its parent too, and a cancel
updates a parent and then its children: on PostgreSQL, two such transactions that took the
same rows' locks in opposite orders would wait for each other for ever (until the server
aborts one). So every transaction that writes several jobs of a family first locks the job's
ancestors, the root first (:func:`lock_ancestors`), then the job, then its descendants.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.store.db import Database
from app.store.orm import Job, JobState, utcnow

__all__ = [
    "PARKED",
    "WAITS_FOR",
    "Parked",
    "beat_parent",
    "children_left",
    "is_parked",
    "jobs_left",
    "live_children",
    "lock_ancestors",
    "progress_plan",
    "queued_children",
]

# The owner of a parked job (never a worker id: those have three colons).
PARKED = "parked"
# The key of a parked job's detail listing the jobs, not its children, that it waits for.
WAITS_FOR = "waits_for"


class Parked(Exception):
    """The job was handed to its children (see :func:`app.jobs.queue.park`); it ends when
    they do."""


_MAX_DEPTH = 8  # a study's atlas's shard is three jobs deep; anything deeper is a loop


def lock_ancestors(session: Session, job_id: int) -> list[int]:
    """Lock the ancestors of a job, the root first, until the transaction ends (PostgreSQL;
    SQLite's writers queue anyway); their ids, root first. The caller then locks or writes the
    job itself, and after it its descendants (the module docstring's order)."""
    chain: list[int] = []
    parent = session.scalar(select(Job.parent_id).where(Job.id == job_id))
    while parent is not None and parent not in chain and len(chain) < _MAX_DEPTH:
        chain.append(parent)
        parent = session.scalar(select(Job.parent_id).where(Job.id == parent))
    for ancestor in reversed(chain):
        session.execute(select(Job.id).where(Job.id == ancestor).with_for_update())
    return chain[::-1]


def is_parked(job_id: int) -> Any:
    return (Job.id == job_id) & (Job.status == JobState.RUNNING) & (Job.worker_id == PARKED)


def progress_plan(parts: float, done: float) -> dict[str, float]:
    """A parent's ``detail`` entry for :func:`beat_parent`: its progress is ``done`` plus its
    children's progress, out of ``parts`` (without it: the mean of its children's)."""
    return {"parts": float(parts), "parts_done": float(done)}


def beat_parent(session: Session, parent_id: int) -> None:
    """Keep a parked parent alive; its progress follows its children's (see
    :func:`progress_plan`)."""
    row = session.execute(select(Job.detail).where(is_parked(parent_id))).first()
    if row is None:  # not parked (any more)
        return
    detail = row[0]
    total, count = session.execute(
        select(func.coalesce(func.sum(Job.progress), 0.0), func.count()).where(
            Job.parent_id == parent_id
        )
    ).one()
    plan = detail if isinstance(detail, dict) and detail.get("parts") else None
    if plan is not None:
        progress = (float(plan.get("parts_done") or 0.0) + float(total)) / float(plan["parts"])
    else:
        progress = float(total) / count if count else 0.0
    session.execute(
        update(Job)
        .where(is_parked(parent_id))
        .values(heartbeat_at=utcnow(), progress=min(max(progress, 0.0), 1.0))
        .execution_options(synchronize_session=False)
    )
    grandparent = session.scalar(select(Job.parent_id).where(Job.id == parent_id))
    if grandparent is not None:  # a study whose atlas is a parked, sharded comparison
        beat_parent(session, grandparent)


def live_children(session: Session, parent_id: int) -> int:
    """How many children of a job are still queued or running."""
    live = (JobState.QUEUED, JobState.RUNNING)
    stmt = select(func.count()).where(Job.parent_id == parent_id, Job.status.in_(live))
    return int(session.scalar(stmt) or 0)


def jobs_left(session: Session, job_id: int) -> int:
    """How many of what a parked job waits for are still queued or running: its children, and
    the jobs its ``detail`` lists under :data:`WAITS_FOR`."""
    detail = session.scalar(select(Job.detail).where(Job.id == job_id))
    waits = detail.get(WAITS_FOR) if isinstance(detail, dict) else None
    others = [int(j) for j in waits if isinstance(j, int)] if isinstance(waits, list) else []
    left = live_children(session, job_id)
    if others:
        live = (JobState.QUEUED, JobState.RUNNING)
        stmt = select(func.count()).where(Job.id.in_(others), Job.status.in_(live))
        left += int(session.scalar(stmt) or 0)
    return left


def queued_children(parent_id: int) -> Any:
    return (Job.parent_id == parent_id) & (Job.status == JobState.QUEUED)


def children_left(db: Database, parent_id: int) -> int:
    """:func:`jobs_left` in a session of its own."""
    with db.session(readonly=True) as s:
        return jobs_left(s, parent_id)
