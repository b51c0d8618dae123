"""The default worker: a pool of threads inside the API process.

Each thread claims the oldest queued job, runs it, and repeats; when the queue is empty it
sleeps until a job is queued in this process (the services' dispatch wakes it) or the poll
interval elapses, so jobs queued by another process (``cka-atlas demo``) are picked up too.
On start, and then every ``stale_after_s / 4`` seconds, running jobs whose heartbeat is older
than ``stale_after_s`` are put back in the queue — so a job whose process was killed resumes
even when the process is restarted before its heartbeat went stale. :meth:`stop` makes a running
job stop at its next batch and gives it back to the queue; a job still inside a step that asks
nothing when :data:`STOP_WAIT_S` have passed is given back (or, cancelled, ended) by
:meth:`stop` itself, so a server stopped with SIGTERM leaves no job ``running``.
"""

from __future__ import annotations

import logging
import threading
import time

from app.jobs.queue import give_back_owned, new_worker_id
from app.jobs.reaper import requeue_stale
from app.jobs.run import execute
from app.jobs.threads import JobThreads, job_threads, start_job_threads, stop_job_threads
from app.store.db import is_transient
from app.store.services import Services

__all__ = ["EmbeddedWorker"]

log = logging.getLogger(__name__)
# How long :meth:`EmbeddedWorker.stop` waits for a running job to reach its next check: below
# the 10 s a container runtime gives a stopping process before SIGKILL (docker, podman).
STOP_WAIT_S = 8.0


class EmbeddedWorker:
    def __init__(
        self,
        services: Services,
        threads: int | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        """``wake``: the event that the services' dispatch sets when a job is queued (see
        :func:`app.jobs.runtime.compose`); without one, only :meth:`notify` and the poll
        interval wake the threads."""
        self.services = services
        self.threads = services.settings.worker_threads if threads is None else threads
        self._wake = wake or threading.Event()
        self._stop = threading.Event()
        self._pool: list[threading.Thread] = []
        self._worker_ids: list[str] = []
        self._reap_lock = threading.Lock()
        self._next_reap = 0.0
        self._cpu: JobThreads | None = None

    def start(self) -> None:
        """Start the threads, the process's CPU threads shared among them
        (:mod:`app.jobs.threads`: looked at again as each job starts and while idle)."""
        self._cpu = start_job_threads(self.services.settings, self.threads)
        self._reap()
        for i in range(self.threads):
            name = self.services.settings.worker_name or "embedded"
            worker_id = new_worker_id(f"{name}-{i}")
            t = threading.Thread(target=self._loop, args=(worker_id,), name=worker_id, daemon=True)
            t.start()
            self._pool.append(t)
            self._worker_ids.append(worker_id)

    def notify(self, _job_id: int | None = None) -> None:
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop taking jobs; a running job stops at its next batch and goes back to the queue.

        A thread still running its job after ``timeout`` seconds (default :data:`STOP_WAIT_S`;
        inside a step that asks for no stop) is left to the process's exit, and its job is given
        back here: the result it might still produce is refused, as its worker no longer owns
        the job.
        """
        timeout = STOP_WAIT_S if timeout is None else timeout
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for t in self._pool:
            t.join(max(deadline - time.monotonic(), 0.0))
        stuck = [w for t, w in zip(self._pool, self._worker_ids, strict=True) if t.is_alive()]
        if stuck:
            try:
                back = give_back_owned(
                    self.services.db,
                    stuck,
                    f"the server stopped and the job did not reach a check within {timeout:g} s",
                )
                if back:
                    log.warning("jobs %s given back to the queue: the server is stopping", back)
            except Exception as exc:  # the database is away: the reaper re-queues them later
                log.warning("could not give back the running jobs (%s)", exc)
        self._pool.clear()
        self._worker_ids.clear()
        if self._cpu is not None:
            stop_job_threads(self._cpu)

    def _reap(self) -> None:
        """Re-queue stale jobs, at most once per ``stale_after_s / 4`` across the pool."""
        stale_after = self.services.settings.stale_after_s
        with self._reap_lock:
            now = time.monotonic()
            if now < self._next_reap:
                return
            self._next_reap = now + max(stale_after / 4, 0.5)
        try:
            requeue_stale(self.services.db, stale_after, self.services.settings.max_attempts)
        except Exception as exc:  # the database may be briefly away; the next round retries
            log.warning("could not look for stale jobs (%s)", type(exc).__name__)

    def _loop(self, worker_id: str) -> None:
        while not self._stop.is_set():
            self._reap()
            try:
                job = execute(self.services, worker_id, shutdown=self._stop)
            except Exception as exc:  # the database may be briefly away; keep the thread alive
                if is_transient(exc):
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    log.warning("worker %s could not claim a job (%s)", worker_id, first)
                else:
                    log.exception("worker %s could not claim a job", worker_id)
                job = None
            if job is None:
                self._wake.wait(self.services.settings.poll_s)
                self._wake.clear()
                job_threads()  # a look at the CPUs while idle: the next job's is a recent one
