"""The stale reaper: running jobs whose worker stopped heartbeating go back to the queue.

A worker killed mid-job (or whose host went down) leaves its job ``running`` with a heartbeat
that no longer moves; every worker runs :func:`requeue_stale` now and then, so another one
picks the job up again. A parked job (:mod:`app.jobs.parking`) is never re-queued while a
child may still run; once they have all ended and nobody took it over, it is re-queued to
settle; when none of its children has beaten for the stale horizon, its queued children are
sent to the workers again (a message dies with a worker killed between taking it and claiming
the job).

A queued job can lose its message too: a broker restarted without persistence forgets its
queue, and a job queued while the broker was unreachable was never published. A Celery worker
with nothing to do runs :func:`republish_queued` now and then and publishes again every job
that has waited longer than ``CKA_QUEUED_GRACE_S``; the claim (a compare-and-set on
``queued``) makes a job run once however many messages name it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from app.jobs.parking import PARKED, beat_parent, is_parked, jobs_left, queued_children
from app.jobs.queue import compare_and_set, queued, with_history
from app.store.db import Database
from app.store.orm import Job, JobState, utcnow

__all__ = ["republish_queued", "requeue_stale"]

log = logging.getLogger(__name__)


def requeue_stale(db: Database, stale_after_s: float, max_attempts: int = 5) -> list[int]:
    """Put running jobs whose heartbeat is older than ``stale_after_s`` back in the queue.

    A stale job already started ``max_attempts`` times is failed instead: its worker keeps
    dying on it (killed for memory, say), and running it again would kill the next one; its
    parked parent cannot finish either and fails with it. Parked jobs follow the rules in the
    module docstring. Returns the ids to send to the workers again: those put back in the
    queue, and the queued children of a parked job none of whose children has beaten for
    ``stale_after_s``.
    """
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    requeued: list[int] = []
    given_up: list[int] = []
    resend: list[int] = []
    with db.session() as s:
        stmt = select(Job.id, Job.attempts, Job.worker_id, Job.parent_id, Job.detail).where(
            Job.status == JobState.RUNNING, Job.heartbeat_at < cutoff
        )
        for jid, attempts, owner, parent, detail in list(s.execute(stmt)):
            if owner == PARKED:
                # With children left, send the queued ones again and wait another
                # stale_after_s; with none left, re-run the parent to settle it.
                if jobs_left(s, jid):
                    resend.extend(s.scalars(select(Job.id).where(queued_children(jid))))
                    beat_parent(s, jid)
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
                event = f"failed by the reaper: its worker stopped responding {attempts} times"
            else:
                # published by the caller now: the grace of republish_queued starts again
                values = {
                    "status": JobState.QUEUED,
                    "worker_id": None,
                    "progress": 0.0,
                    "published_at": utcnow(),
                }
                event = (
                    "re-queued by the reaper: its children have all ended"
                    if owner == PARKED
                    else f"re-queued by the reaper: no heartbeat for {stale_after_s:g} s"
                )
            stale = (Job.id == jid) & (Job.status == JobState.RUNNING) & (Job.heartbeat_at < cutoff)
            if compare_and_set(s, stale, **values, detail=with_history(detail, event, owner)):
                (given_up if give_up else requeued).append(jid)
                if give_up and parent is not None:  # its parent cannot finish either
                    compare_and_set(s, is_parked(parent), **values)
    if requeued:
        log.warning("re-queued stale jobs %s", requeued)
    if given_up:
        log.error("failed stale jobs %s after %d attempts each", given_up, max_attempts)
    if resend:
        log.warning("sending queued children %s again: none of their siblings is running", resend)
    return requeued + [j for j in resend if j not in requeued]


def republish_queued(db: Database, grace_s: float, limit: int = 1000) -> list[int]:
    """Queued jobs that have waited longer than ``grace_s`` since they were queued or last
    published again: their ids, each marked published now, so that across all the workers
    (and their reapers) a job is published again at most once per ``grace_s``.

    Called by a worker with nothing to do: a job it could run is waiting, so its message is
    probably lost. Oldest first, at most ``limit`` of them.
    """
    cutoff = utcnow() - timedelta(seconds=grace_s)
    waited = func.coalesce(Job.published_at, Job.created_at) < cutoff
    out: list[int] = []
    with db.session() as s:
        ids = list(
            s.scalars(
                select(Job.id)
                .where(Job.status == JobState.QUEUED, waited)
                .order_by(Job.id)
                .limit(limit)
            )
        )
        now = utcnow()
        for jid in ids:  # another reaper may have marked it meanwhile
            if compare_and_set(s, queued(jid) & waited, published_at=now):
                out.append(jid)
    if out:
        log.warning(
            "publishing queued jobs %s again: no worker took them within %.0f s",
            out,
            grace_s,
        )
    return out
