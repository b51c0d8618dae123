"""Celery wiring for GPU hosts: Redis broker, one solo-pool worker per GPU.

The task only carries a job id and calls the same :func:`app.jobs.run.execute` as the
embedded worker; the database row decides whether the job still needs running, so a
redelivered or duplicated message is harmless. ``acks_late`` with ``prefetch 1`` means a
worker killed mid-job leaves its message unacknowledged and Redis redelivers it after the
visibility timeout, which is set above the longest job (a shorter one would hand a healthy
long job to a second worker). Nothing waits for that timeout, though: on start a worker
re-queues stale jobs and re-sends every queued job, and while it runs a reaper thread
re-queues and re-sends, every ``stale_after_s / 4`` seconds, each running job whose
heartbeat is older than ``stale_after_s`` (its worker was killed, or its host went down).
A worker imports what its jobs would import on first use before it takes any
(:data:`LAZY_IMPORTS`).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from functools import cache
from typing import Any

from celery import Celery

from app.jobs.queue import claim, new_worker_id, queued_ids
from app.jobs.reaper import requeue_stale
from app.jobs.run import run_claimed
from app.store.db import ensure_schema, retry
from app.store.services import Services
from app.store.settings import Settings

__all__ = ["TASK_NAME", "make_celery", "run_worker", "send_job"]

log = logging.getLogger(__name__)
TASK_NAME = "cka_atlas.run_job"
# What the jobs import on first use (the built-in datasets' loader, which a study's planning
# and its trainings call), a fifth of a second that the first study on a fresh worker would
# wait for: the worker imports them as it starts.
LAZY_IMPORTS = ("sklearn.datasets", "sklearn.model_selection")


def make_celery(settings: Settings) -> Celery:
    if not settings.broker_url:
        raise ValueError("CKA_BROKER_URL is not set; the Celery worker needs a Redis broker")
    app = Celery("cka_atlas", broker=settings.broker_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=settings.celery_queue,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.job_timeout_s + 600},
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    app.task(name=TASK_NAME, bind=False)(_run_job_task)
    return app


@cache
def _services() -> Services:
    services = Services(Settings())
    celery = make_celery(services.settings)
    services.dispatch = lambda job_id: send_job(celery, job_id)  # a comparison's shards
    return services


def _run_job_task(job_id: int) -> None:
    services = _services()
    worker_id = _worker_id()
    # The message is acknowledged when this returns or raises, so a database that is away
    # at delivery is waited for (with backoff) rather than losing the job's only message.
    job = retry(
        lambda: claim(services.db, worker_id, int(job_id)),
        timeout=max(services.settings.stale_after_s, 10.0),
        what=f"claiming job {job_id}",
    )
    if job is not None:  # None: already taken, finished or cancelled (a duplicate message)
        run_claimed(services, job, worker_id)


@cache
def _worker_id() -> str:
    name = _services().settings.worker_name
    return new_worker_id(f"celery-{name}" if name else "celery")


def send_job(celery: Celery, job_id: int) -> None:
    celery.send_task(TASK_NAME, args=[job_id])


def run_worker(settings: Settings, loglevel: str = "INFO") -> None:
    """Prepare the queue and run a Celery worker in this process (blocks)."""
    services = Services(settings)
    ensure_schema(services.db.engine)
    celery = make_celery(settings)
    requeue_stale(services.db, settings.stale_after_s, settings.max_attempts)
    for module in LAZY_IMPORTS:  # before any job, so no job waits for them
        importlib.import_module(module)
    for job_id in queued_ids(services.db, limit=10_000):
        send_job(celery, job_id)
    threading.Thread(
        target=_reap_forever, args=(services, celery), name="stale-reaper", daemon=True
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


def _reap_forever(services: Any, celery: Celery) -> None:
    """Re-queue and re-send jobs whose worker stopped heartbeating (runs in a daemon thread)."""
    stale_after = services.settings.stale_after_s
    while True:
        time.sleep(max(stale_after / 4, 0.5))
        try:
            for job_id in requeue_stale(services.db, stale_after, services.settings.max_attempts):
                send_job(celery, job_id)
        except Exception as exc:  # database or broker briefly away: the next round retries
            log.warning("could not re-queue stale jobs (%s)", type(exc).__name__)
