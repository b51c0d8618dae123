"""Celery wiring for GPU hosts: Redis broker, one solo-pool worker per GPU.

The task only carries a job id and calls the same :func:`app.jobs.run.execute` as the
embedded worker; the database row decides whether the job still needs running, so a
redelivered or duplicated message is harmless (:mod:`app.jobs.broker`). ``acks_late`` with
``prefetch 1`` means a worker killed mid-job leaves its message unacknowledged and Redis
redelivers it after the visibility timeout, which is set above the longest job (a shorter one
would hand a healthy long job to a second worker). Nothing waits for that timeout, though: on
start a worker re-queues stale jobs and re-sends every queued job, and while it runs a reaper
thread, every quarter of ``stale_after_s`` or ``queued_grace_s`` (the shorter), re-queues and
re-sends each running job whose heartbeat is older than ``stale_after_s`` (its worker was
killed, or its host went down) and, while this worker has nothing to do, publishes again each
job queued longer than ``queued_grace_s`` (its message was lost with a broker that restarted
without persistence, or never sent while the broker was away). A worker imports what its jobs
would import on first use before it takes any (:data:`LAZY_IMPORTS`).

A worker told to stop (SIGTERM, SIGINT: Celery's warm shutdown) hands its job back at the
job's next check instead of finishing it: Celery's ``worker_shutting_down`` signal sets the
job's stop event, the job goes back to the queue (said in its history) and is published again
for another worker, and the task returns, so the worker exits within a batch or a training step.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from functools import cache

from celery import Celery
from celery.signals import worker_shutting_down

from app.jobs.broker import TASK_NAME, make_celery
from app.jobs.queue import claim, new_worker_id, queued_ids
from app.jobs.reaper import republish_queued, requeue_stale
from app.jobs.run import run_claimed
from app.jobs.runtime import compose
from app.jobs.threads import start_job_threads
from app.store.db import ensure_schema, retry
from app.store.services import Services
from app.store.settings import Settings

__all__ = ["run_worker", "worker_celery"]

log = logging.getLogger(__name__)
# What the jobs import on first use (the built-in datasets' loader, which a study's planning
# and its trainings call), a fifth of a second that the first study on a fresh worker would
# wait for: the worker imports them as it starts.
LAZY_IMPORTS = ("sklearn.datasets", "sklearn.model_selection")
# Set while this process runs a task: its reaper publishes lost queued jobs only when clear.
_busy = threading.Event()
# Set when the worker is told to stop: the running job stops at its next check (JobControl).
_stopping = threading.Event()


@worker_shutting_down.connect
def _on_shutdown(**_: object) -> None:
    _stopping.set()


def worker_celery(settings: Settings) -> Celery:
    """The Celery app a worker runs: :func:`~app.jobs.broker.make_celery` with the task."""
    app = make_celery(settings)
    app.task(name=TASK_NAME, bind=False)(_run_job_task)
    return app


@cache
def _services() -> Services:
    """This worker process's services (from the environment, as ``cka-atlas worker`` reads
    it): the composition root's, publishing a study's or a comparison's children."""
    return compose(Settings(), threads=0).services


def _run_job_task(job_id: int) -> None:
    services = _services()
    worker_id = _worker_id()
    # The message is acknowledged when this returns or raises, so a database that is away
    # at delivery is waited for (with backoff) rather than losing the job's only message.
    _busy.set()
    try:
        job = retry(
            lambda: claim(services.db, worker_id, int(job_id)),
            timeout=max(services.settings.stale_after_s, 10.0),
            what=f"claiming job {job_id}",
        )
        if job is not None:  # None: already taken, finished or cancelled (a duplicate message)
            run_claimed(services, job, worker_id, _stopping)
    finally:
        _busy.clear()


@cache
def _worker_id() -> str:
    name = _services().settings.worker_name
    return new_worker_id(f"celery-{name}" if name else "celery")


def run_worker(loglevel: str = "INFO") -> None:
    """Prepare the queue and run a Celery worker in this process (blocks); its settings come
    from the environment."""
    services = _services()
    settings = services.settings
    ensure_schema(services.db.engine)
    celery = worker_celery(settings)
    requeue_stale(services.db, settings.stale_after_s, settings.max_attempts)
    for module in LAZY_IMPORTS:  # before any job, so no job waits for them
        importlib.import_module(module)
    start_job_threads(settings, workers=1)  # the solo pool: one job at a time
    for job_id in queued_ids(services.db, limit=10_000):
        services.dispatch(job_id)
    threading.Thread(
        target=_reap_forever, args=(services,), name="stale-reaper", daemon=True
    ).start()
    node = [f"--hostname={settings.worker_name}@%h"] if settings.worker_name else []
    celery.worker_main(
        [
            "worker",
            *node,
            "--pool=solo",
            "--concurrency=1",
            "--prefetch-multiplier=1",
            f"--queues={settings.celery_queue}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def _reap_forever(services: Services) -> None:
    """Re-queue and re-send jobs whose worker stopped heartbeating, and, while this worker is
    idle, publish again the queued jobs nobody took (runs in a daemon thread)."""
    settings = services.settings
    every = max(min(settings.stale_after_s, settings.queued_grace_s) / 4, 0.5)
    while True:
        time.sleep(every)
        try:
            resend = requeue_stale(services.db, settings.stale_after_s, settings.max_attempts)
            if not _busy.is_set():
                resend += republish_queued(services.db, settings.queued_grace_s)
            for job_id in resend:
                services.dispatch(job_id)
        except Exception as exc:  # database or broker briefly away: the next round retries
            log.warning("could not re-queue stale jobs (%s)", type(exc).__name__)
