"""Running jobs: claim, dispatch by kind to its handler, record the outcome.

How a job ends: succeeded (result written once, retried across a database restart),
failed (an English sentence in ``jobs.error``: bad input, the artifact store read-only or
full, ...), cancelled, or given back to the queue when its worker shuts down or the
database is unreachable — never left half-written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import select

import analysis
from app.errors import problem_of
from app.jobs.compare import run_comparison
from app.jobs.control import JobControl, timeout_message
from app.jobs.demo import run_demo
from app.jobs.parking import Parked, children_left
from app.jobs.queue import (
    CancelRequested,
    LostJob,
    claim,
    fail,
    mark_cancelled,
    release,
    retry_s,
    take_over,
)
from app.jobs.shards import run_shard
from app.jobs.study import run_study, run_study_training
from app.jobs.threads import job_threads
from app.jobs.train import run_training
from app.logs import job_context
from app.store.artifacts import StoreError
from app.store.db import is_transient
from app.store.orm import Job, JobRequester, Study
from app.store.services import Services

__all__ = ["HANDLERS", "execute", "run_claimed"]

log = logging.getLogger(__name__)


def _run_training(services: Services, job: Job, control: JobControl) -> None:
    # A study's training names its study; any other is a /v1/trainings request (the demo's
    # included, children of the demo job).
    study = (job.detail or {}).get("study_id") is not None
    (run_study_training if study else run_training)(services, job, control)


# One handler per job kind: ``handler(services, job, control)`` does the work and writes the
# result through :meth:`app.jobs.control.JobControl.commit`.
HANDLERS: dict[str, Callable[[Services, Job, JobControl], None]] = {
    "comparison": run_comparison,
    "training": _run_training,
    "study": run_study,
    "shard": run_shard,
    "demo": run_demo,
}


def _run(services: Services, job: Job, control: JobControl) -> None:
    handler = HANDLERS.get(job.kind)
    if handler is None:
        raise ValueError(f"unknown job kind {job.kind!r}")
    handler(services, job, control)


def _error_code(exc: BaseException) -> str:
    known = problem_of(exc)
    if known is not None:
        return known[1]
    if isinstance(exc, OSError):
        return "storage_error"
    if isinstance(exc, ValueError):
        return "invalid_input"
    return "internal_error"


def execute(
    services: Services,
    worker_id: str,
    job_id: int | None = None,
    shutdown: threading.Event | None = None,
) -> Job | None:
    """Claim ``job_id`` (or the oldest queued job), run it, record the outcome.

    Returns the claimed job, or None when there was nothing to claim (already taken,
    finished or cancelled — so a duplicate Celery message is harmless).
    """
    job = claim(services.db, worker_id, job_id)
    if job is None:
        return None
    run_claimed(services, job, worker_id, shutdown)
    return job


def run_claimed(
    services: Services,
    job: Job,
    worker_id: str,
    shutdown: threading.Event | None = None,
    *,
    resumed: bool = False,
) -> None:
    """Run a job this worker has claimed and record how it ended.

    ``shutdown`` set while the job runs stops it at its next batch and puts it back in the
    queue for the next worker. The job runs on the CPU threads that are idle as it starts
    (:func:`app.jobs.threads.job_threads`). ``resumed``: a parked job taken back from its
    children. Its start and end are logged at INFO for a job of its own first started; a job
    that is part of another (a study's or the demo's training, a shard) and a parent's
    parking and resuming log them at DEBUG, so that the terminal of ``make run`` shows the
    demo's one line per model rather than five.
    """
    lifecycle = logging.DEBUG if job.parent_id is not None or resumed else logging.INFO
    job_threads()
    interval = min(services.settings.heartbeat_s, 1.0)
    with (
        job_context(job.id, job.kind),  # every log record of this job carries its id
        JobControl(
            services.db,
            job.id,
            worker_id,
            interval,
            shutdown,
            retry_timeout=retry_s(services.settings),
            time_limit_s=services.settings.job_timeout_s,
            progress=float(job.progress or 0.0),
        ) as control,
    ):
        log.log(lifecycle, "job %s (%s) started on %s", job.id, job.kind, worker_id)
        parked = False
        try:
            _run(services, job, control)
            log.log(
                logging.DEBUG if job.parent_id is not None else logging.INFO,
                "job %s succeeded",
                job.id,
            )
        except Parked as waiting:
            log.debug("%s", waiting)
            parked = True
        except Exception as exc:
            try:
                _record_end(services, control, exc)
            except Exception as again:  # the database is still away: the job goes stale
                log.error(
                    "job %s: could not record how it ended (%s); it is re-queued once its "
                    "heartbeat is %s s old",
                    job.id,
                    str(again).strip().splitlines()[0] if str(again).strip() else again,
                    services.settings.stale_after_s,
                )
    if parked:  # its children may all have ended before it was parked: nobody would wake it
        _settle(services, job.id, worker_id, shutdown)
    for waiter in _waiters(services, job.id):
        _settle(services, waiter, worker_id, shutdown)


def _waiters(services: Services, job_id: int) -> list[int]:
    """The jobs that may wait for this one: its parent (read again: a study may adopt a
    comparison), then the studies that hold it without being its parent (an atlas that two
    identical studies share: the second waits parked, :data:`app.jobs.parking.WAITS_FOR`)."""
    with services.db.session(readonly=True) as s:
        parent = s.scalar(select(Job.parent_id).where(Job.id == job_id))
        holders = s.scalars(
            select(JobRequester.requester).where(
                JobRequester.job_id == job_id,
                JobRequester.withdrawn_at.is_(None),
                JobRequester.requester.startswith("study:"),
            )
        ).all()
        study_ids = [int(h.partition(":")[2]) for h in holders if h.partition(":")[2].isdigit()]
        studies = s.scalars(select(Study.job_id).where(Study.id.in_(study_ids))).all()
    return list(dict.fromkeys(j for j in (parent, *studies) if j is not None and j != job_id))


def _settle(
    services: Services, parent_id: int, worker_id: str, shutdown: threading.Event | None
) -> None:
    """After a child ended: if none of its siblings is left, this worker takes the parked
    parent back and runs it again (a comparison combines its shards, a study queues its atlas
    or summarises; either fails or cancels as its children ended)."""
    if children_left(services.db, parent_id):
        return
    parent = take_over(services.db, parent_id, worker_id)
    if parent is not None:  # None: another worker took it, or it was cancelled meanwhile
        run_claimed(services, parent, worker_id, shutdown, resumed=True)


def _give_back(services: Services, control: JobControl, why: str, timeout: float) -> None:
    """Back to the queue, said in its history, and published again for the next worker (a
    Celery worker that stops has its message acknowledged as the task returns)."""
    if release(services.db, control.job_id, control.worker_id, why, timeout=timeout):
        try:
            services.dispatch(control.job_id)
        except Exception as exc:  # the broker is away: a worker's reaper publishes it later
            log.warning("job %s: could not publish it again (%s)", control.job_id, exc)


def _record_end(services: Services, control: JobControl, exc: Exception) -> None:
    db, job_id, worker_id = services.db, control.job_id, control.worker_id
    if control.expired:
        log.info("job %s stopped: its runner had ended it at its time limit", job_id)
    elif isinstance(exc, CancelRequested):
        mark_cancelled(db, job_id, worker_id, progress=control.progress)
        log.info("job %s cancelled: %s", job_id, exc)
    elif isinstance(exc, LostJob):
        log.warning("job %s: %s", job_id, exc)
    elif control.lost:
        log.warning("job %s lost while failing: %s", job_id, exc)
    elif isinstance(exc, analysis.Cancelled) and control.timed_out:
        message = timeout_message(services.settings.job_timeout_s)
        log.warning("job %s failed: %s", job_id, message)
        fail(
            db,
            job_id,
            worker_id,
            message,
            "job_timeout",
            timeout=retry_s(services.settings),
            event="stopped at a check: CKA_JOB_TIMEOUT_S passed",
        )
    elif isinstance(exc, analysis.Cancelled) and control.cancel_requested:
        mark_cancelled(db, job_id, worker_id, progress=control.progress)
        log.info("job %s cancelled", job_id)
    elif isinstance(exc, analysis.Cancelled) and control.shutdown.is_set():
        _give_back(services, control, f"its worker was stopped at {control.progress:.0%}", 10.0)
        log.info("job %s put back in the queue: its worker is stopping", job_id)
    elif isinstance(exc, analysis.Cancelled):
        mark_cancelled(db, job_id, worker_id, progress=control.progress)
        log.info("job %s cancelled", job_id)
    elif is_transient(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("job %s interrupted by the database (%s); re-queued", job_id, first)
        _give_back(
            services, control, f"the database went away ({first[:200]})", retry_s(services.settings)
        )
    else:
        code = _error_code(exc)
        if code == "internal_error":
            log.exception("job %s failed", job_id, exc_info=exc)
            message = f"{type(exc).__name__}: {exc}"
        elif isinstance(exc, StoreError):
            message = str(exc)
        elif code == "storage_error":
            message = f"the artifact store could not be written: {exc}"
        else:
            message = str(exc)
        log.warning("job %s failed: %s", job_id, message)
        fail(db, job_id, worker_id, message, code, timeout=retry_s(services.settings))
