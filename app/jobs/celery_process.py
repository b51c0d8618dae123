"""``cka-atlas worker`` processes started from Python, serving the same store as an app.

For what runs Celery workers next to an in-process app that only enqueues (the benches that
measure workers, the tests that kill one): :func:`worker_env` passes a :class:`Settings` to a
worker process through the environment, :func:`celery_workers` starts named workers, one
thread each, in process groups of their own, hands them over once every one consumes the
queue, and stops those still running on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.jobs.broker import make_celery
from app.store.settings import Settings

__all__ = ["celery_workers", "own_store", "worker_env", "worker_logs"]


def worker_env(settings: Settings) -> dict[str, str]:
    """This process's environment with ``settings``' database, store, broker, queue, device,
    heartbeat, stale horizon and log level, and one CPU thread."""
    return os.environ | {
        "CKA_DATABASE_URL": settings.resolved_database_url,
        "CKA_DATA_DIR": str(settings.data_dir),
        "CKA_BROKER_URL": str(settings.broker_url),
        "CKA_CELERY_QUEUE": settings.celery_queue,
        "CKA_DEVICE": settings.device,
        "CKA_HEARTBEAT_S": str(settings.heartbeat_s),
        "CKA_STALE_AFTER_S": str(settings.stale_after_s),
        "CKA_LOG_LEVEL": settings.log_level,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def own_store(root: Path, broker_url: str, database_url: str | None = None) -> Settings:
    """Settings of a throwaway store under ``root`` (SQLite file, unless ``database_url`` names
    another database, and artifacts) whose app only enqueues, on a queue of its own at
    ``broker_url``: nothing is shared with another run."""
    return Settings(
        database_url=database_url or f"sqlite:///{root / 'cka.db'}",
        data_dir=root / "data",
        broker_url=broker_url,
        celery_queue=f"bench-{uuid.uuid4().hex[:8]}",
        device="cpu",
        api_tokens="",
        worker_threads=0,
        log_level="warning",
    )


def _log(log_dir: Path, name: str) -> Path:
    return log_dir / f"{name}.log"


@contextmanager
def celery_workers(
    settings: Settings, log_dir: Path, names: Sequence[str | None], ready_s: float = 180
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """``cka-atlas worker [--name NAME]`` per name (None: unnamed, listed as ``worker``), each
    writing ``log_dir/<name>.log``, handed over once every one consumes the settings' queue
    (jobs sent while one still imports torch would all go to the others); every one still
    running is stopped (SIGTERM to its group) when the block ends. A worker that exits or is
    not consuming within ``ready_s`` seconds is a :class:`RuntimeError` naming it."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in names:
            node = ["--name", name] if name else []
            with _log(log_dir, name or "worker").open("wb") as out:
                procs[name or "worker"] = subprocess.Popen(
                    [sys.executable, "-m", "app.cli", "worker", *node],
                    env=worker_env(settings),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        _wait_consuming(settings, log_dir, procs, ready_s)
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)


def _wait_consuming(
    settings: Settings, log_dir: Path, procs: dict[str, subprocess.Popen[bytes]], ready_s: float
) -> None:
    control = make_celery(settings).control
    deadline = time.monotonic() + ready_s
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None:
                tail = _log(log_dir, name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {name} exited with {proc.returncode}: {tail}")
        queues = control.inspect(timeout=1).active_queues() or {}
        consuming = sum(
            any(q["name"] == settings.celery_queue for q in qs) for qs in queues.values()
        )
        if consuming >= len(procs):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{consuming} of {len(procs)} workers consumed {settings.celery_queue} "
                f"within {ready_s:.0f} s (logs in {log_dir})"
            )


def worker_logs(log_dir: Path, procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, str]:
    """What each worker of :func:`celery_workers` wrote, by name."""
    return {name: _log(log_dir, name).read_text(errors="replace") for name in procs}
