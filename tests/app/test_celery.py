"""The Celery path against a real Redis (the session's, see tests/servers.py) and a real worker
process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.http.main import create_app
from app.jobs import states as jobs
from app.store.orm import Comparison, Job, utcnow
from app.store.services import Services
from app.store.settings import Settings
from tests.helpers import digits_id, register, wait


@pytest.fixture
def broker_settings(settings: Settings, redis_url: str) -> Iterator[Settings]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()
    except redis.RedisError as exc:  # fail, never skip: the Celery pass is required
        pytest.fail(f"Redis at {redis_url} is unreachable ({exc}); the Celery tests need it")
    queue = f"cka-test-{uuid.uuid4().hex[:10]}"
    yield settings.model_copy(update={"broker_url": redis_url, "celery_queue": queue})
    client.delete(queue, f"{queue}\x06\x161", f"{queue}\x06\x162")
    client.close()


def _worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    """``cka-atlas worker`` in its own process group, output to ``log``."""
    env = os.environ | {
        "CKA_DATABASE_URL": settings.resolved_database_url,
        "CKA_DATA_DIR": str(settings.data_dir),
        "CKA_BROKER_URL": str(settings.broker_url),
        "CKA_CELERY_QUEUE": settings.celery_queue,
        "CKA_DEVICE": "cpu",
        "CKA_HEARTBEAT_S": "0.2",
        "CKA_STALE_AFTER_S": "30",
        "OMP_NUM_THREADS": "1",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_celery_worker_runs_queued_and_stale_jobs(
    broker_settings: Settings, zoo: dict[str, Path], tmp_path: Path
) -> None:
    with TestClient(create_app(broker_settings)) as client:
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        ids = register(client, zoo, "mixer_digits", "gmlp_digits", "mlp_digits")
        body = {"dataset_id": digits_id(client), "batch_size": 150}
        queued = client.post("/v1/comparisons", json={"model_ids": ids[:2], **body})
        stale = client.post("/v1/comparisons", json={"model_ids": ids[1:], **body})
        assert queued.status_code == stale.status_code == 202
        # The second job's worker "died": running, with a heartbeat long past.
        with services.db.session() as s:
            stale_job = s.get(Comparison, stale.json()["id"]).job_id  # type: ignore[union-attr]
        dead = jobs.claim(services.db, "celery:dead", stale_job)
        assert dead is not None
        with services.db.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == dead.id)
                .values(heartbeat_at=utcnow() - timedelta(hours=1))
            )
        proc = _worker(broker_settings, tmp_path / "worker.log")
        try:
            first = wait(client, queued.headers["location"], timeout=180, alive=proc)
            second = wait(client, stale.headers["location"], timeout=180, alive=proc)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        log = (tmp_path / "worker.log").read_text(errors="replace")
        assert first["status"] == "succeeded", (first, log)
        assert second["status"] == "succeeded", (second, log)
        assert first["provenance"]["worker"].startswith("celery:")
        with services.db.session() as s:
            assert s.get(Job, dead.id).attempts == 2  # type: ignore[union-attr]
