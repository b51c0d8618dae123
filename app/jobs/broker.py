"""The Celery broker as the API and the workers use it: a message is a job id, nothing more.

The database's ``jobs`` row is the job; a message only tells a worker to claim it, and the
claim (a compare-and-set on ``queued``) is what makes a job run once, however many messages
name it. So a message may be lost or duplicated without harm to the result: a publish that
cannot reach the broker (down, restarting) is logged and the job stays ``queued``; a
worker's reaper publishes it again once it has waited ``CKA_QUEUED_GRACE_S``
(:func:`app.jobs.reaper.republish_queued`), and a message the broker lost is replaced the
same way. A sender needs only the task's name; the worker registers the task itself
(:mod:`app.jobs.celery_app`).
"""

from __future__ import annotations

import logging

from celery import Celery
from kombu.exceptions import OperationalError

from app.store.settings import Settings

__all__ = ["TASK_NAME", "make_celery", "send_job"]

log = logging.getLogger(__name__)
TASK_NAME = "cka_atlas.run_job"
# A publish that cannot reach the broker gives up after these tries (about a second), so a
# request that queues a job never waits long for a broker that is down.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.4, "interval_max": 1}


def make_celery(settings: Settings) -> Celery:
    """The Celery app of ``settings``' broker and queue (no task registered)."""
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
        task_publish_retry_policy=PUBLISH_RETRY,
        broker_connection_timeout=2.0,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.job_timeout_s + 600},
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


def send_job(celery: Celery, job_id: int) -> bool:
    """Publish ``job_id`` to the workers; False (and one warning) when the broker cannot be
    reached: the job stays queued and a worker's reaper publishes it later."""
    try:
        celery.send_task(TASK_NAME, args=[job_id])
    except OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning(
            "could not publish job %s to the broker (%s); it stays queued and a worker "
            "publishes it once it has waited CKA_QUEUED_GRACE_S",
            job_id,
            first,
        )
        return False
    return True
