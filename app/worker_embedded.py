"""The default worker: a pool of threads inside the API process.

Each thread claims the oldest queued job, runs it, and repeats; when the queue is empty it
sleeps until :meth:`notify` (called when the API enqueues) or the poll interval elapses, so
jobs queued by another process (``cka-atlas demo``) are picked up too. On start, running
jobs whose heartbeat is stale are put back in the queue.
"""

from __future__ import annotations

import logging
import threading

from app import jobs
from app.runner import execute
from app.services import Services

__all__ = ["EmbeddedWorker"]

log = logging.getLogger(__name__)


class EmbeddedWorker:
    def __init__(self, services: Services, threads: int | None = None) -> None:
        self.services = services
        self.threads = services.settings.worker_threads if threads is None else threads
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pool: list[threading.Thread] = []

    def start(self) -> None:
        jobs.requeue_stale(self.services.db, self.services.settings.stale_after_s)
        for i in range(self.threads):
            worker_id = jobs.new_worker_id(f"embedded-{i}")
            t = threading.Thread(target=self._loop, args=(worker_id,), name=worker_id, daemon=True)
            t.start()
            self._pool.append(t)

    def notify(self, _job_id: int | None = None) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs; a running job finishes (or is re-queued later as stale)."""
        self._stop.set()
        self._wake.set()
        for t in self._pool:
            t.join(timeout)
        self._pool.clear()

    def _loop(self, worker_id: str) -> None:
        while not self._stop.is_set():
            try:
                job = execute(self.services, worker_id)
            except Exception:  # the database may be briefly away; keep the thread alive
                log.exception("worker %s could not claim a job", worker_id)
                job = None
            if job is None:
                self._wake.wait(self.services.settings.poll_s)
                self._wake.clear()
