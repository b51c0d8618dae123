"""The composition root: a process's :class:`Services`, the dispatch that hands its new jobs
to a worker, and that worker — built in one place, for the API, the commands and the workers.

- With ``CKA_BROKER_URL``, a new job is published to the Celery workers
  (:func:`app.jobs.broker.send_job`; a broker that cannot be reached leaves it queued for a
  worker's reaper to publish) and nothing runs here.
- Without, ``threads`` threads of this process (:class:`~app.jobs.embedded.EmbeddedWorker`,
  default ``CKA_WORKER_THREADS``) run the jobs and a new job wakes them; with none, a new
  job waits in the database for a worker that polls it (``cka-atlas worker``, a server).

:func:`compose` builds; :func:`running` also prepares the store, starts the worker and stops
it (and closes the services) at the end. The services are frozen once built: nothing
attaches a worker or changes the dispatch afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from celery import Celery

from app.jobs.broker import make_celery, send_job
from app.jobs.embedded import EmbeddedWorker
from app.store.db import Database
from app.store.services import Services
from app.store.settings import Settings

__all__ = ["Runtime", "compose", "running"]


@dataclass(frozen=True)
class Runtime:
    """The services of a process, its in-process worker (None: jobs run elsewhere) and the
    Celery app it publishes with (None: no broker)."""

    services: Services
    worker: EmbeddedWorker | None = None
    celery: Celery | None = None

    def start(self) -> None:
        """Start the in-process worker, if any (after the schema exists: it reads the jobs),
        its CPU threads shared among its job threads and looked at again as each job starts
        (:mod:`app.jobs.threads`)."""
        if self.worker is not None:
            self.worker.start()

    def close(self) -> None:
        """Stop the worker (its running job goes back to the queue), release the broker
        connections and the database."""
        try:
            if self.worker is not None:
                self.worker.stop()
        finally:
            if self.celery is not None:
                self.celery.close()
            self.services.close()


def compose(
    settings: Settings, *, threads: int | None = None, db: Database | None = None
) -> Runtime:
    """Build this process's services with their dispatch, and its worker (not started).

    ``threads``: in-process worker threads when there is no broker (None:
    ``CKA_WORKER_THREADS``; 0: none). ``db``: an open database to use instead of a new one.
    """
    if settings.broker_url:
        celery = make_celery(settings)
        return Runtime(Services(settings, db, dispatch=partial(_publish, celery)), celery=celery)
    count = settings.worker_threads if threads is None else threads
    if count <= 0:
        return Runtime(Services(settings, db))
    wake = threading.Event()
    services = Services(settings, db, dispatch=lambda _job_id: wake.set())
    return Runtime(services, EmbeddedWorker(services, threads=count, wake=wake))


def _publish(celery: Celery, job_id: int) -> None:
    send_job(celery, job_id)  # False (logged) when the broker is away: a reaper sends it later


@contextmanager
def running(
    settings: Settings,
    *,
    threads: int | None = None,
    prepare: Callable[[Services], object] | None = None,
) -> Iterator[Services]:
    """:func:`compose`, then ``prepare(services)`` (the schema, the built-in datasets), then
    the worker started; on the way out the worker stopped and everything closed."""
    runtime = compose(settings, threads=threads)
    try:
        if prepare is not None:
            prepare(runtime.services)
        runtime.start()
        yield runtime.services
    finally:
        runtime.close()
