"""The demo behind ``make run``: the zoo's trainings and its atlas queued as jobs.

:func:`setup_demo` prepares the store and finds or queues the ``demo`` job
(:mod:`app.jobs.demo`), registering the zoo checkpoints the folder already holds; it trains
nothing itself. The server's in-process worker (``cka-atlas serve --demo`` queues it and
serves at once) or ``cka-atlas worker`` runs the trainings one by one, then the atlas.
Idempotent: a second start finds the demo job and queues nothing.
"""

from __future__ import annotations

from pathlib import Path

from app.cli.store import ensure_store
from app.jobs.demo import queue_demo
from app.jobs.runtime import running
from app.store.settings import Settings

__all__ = ["setup_demo"]


def setup_demo(
    settings: Settings, zoo_dir: str | Path | None, *, epochs: int | None = None
) -> tuple[int, bool]:
    """Find or queue the demo job (``epochs``: a quick demo); returns (job id, queued now)."""
    # No worker here: the server's (or `cka-atlas worker`'s) runs the jobs; with a broker the
    # composition root's dispatch publishes them to the Celery workers.
    with running(settings, threads=0) as services:
        ensure_store(services.db.engine, settings.data_dir)
        return queue_demo(services, zoo_dir, epochs=epochs)
