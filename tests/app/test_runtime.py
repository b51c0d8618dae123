"""The composition root (app/jobs/runtime.py): one place builds Services and attaches workers."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from app.jobs.requests import ComparisonIn
from app.jobs.runtime import compose, running
from app.jobs.submit import submit_comparison
from app.jobs.train import register_checkpoint
from app.store.datasets import register_builtin_datasets
from app.store.db import ensure_schema
from app.store.orm import Comparison
from app.store.services import Services, nowhere
from app.store.settings import Settings
from tests.helpers import make_settings

APP = Path(__file__).resolve().parents[2] / "app"


def test_services_are_frozen_once_built(tmp_path: Path) -> None:
    services = Services(make_settings(f"sqlite:///{tmp_path / 'x.db'}", tmp_path))
    try:
        with pytest.raises(FrozenInstanceError):
            services.dispatch = print  # type: ignore[misc]
        with pytest.raises(FrozenInstanceError):
            services.db = services.db  # type: ignore[misc]
        assert "api_tokens" not in repr(services)  # the settings hold secrets
    finally:
        services.close()


def test_only_the_composition_root_builds_services_and_workers() -> None:
    """Every process gets its services and worker from app.jobs.runtime, nowhere else."""
    builds = re.compile(r"\b(Services|EmbeddedWorker)\(")
    found = sorted(
        str(path.relative_to(APP.parent))
        for path in APP.rglob("*.py")
        if builds.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["app/jobs/runtime.py"]


def test_without_a_broker_a_new_job_wakes_the_in_process_worker(
    tmp_path: Path, zoo: dict[str, Path]
) -> None:
    """The worker polls every 60 s; the job runs at once because its dispatch wakes it."""
    settings = make_settings(f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "data", poll_s=60.0)

    def prepare(services: Services) -> None:
        ensure_schema(services.db.engine)

    with running(settings, threads=1, prepare=prepare) as services:
        digits = register_builtin_datasets(services)[0].id
        ids = []
        for name in ("mixer_digits", "gmlp_digits"):
            path = zoo[name]
            row, _ = register_checkpoint(
                services, path, path.with_suffix(".json"), name=name, source="upload"
            )
            ids.append(row.id)
        time.sleep(0.5)  # the worker has looked, found nothing, and sleeps
        body = ComparisonIn(model_ids=ids, dataset_id=digits, batch_size=150)
        cid, _ = submit_comparison(services, body)
        deadline = time.monotonic() + 30
        while _status(services, cid) != "succeeded":
            assert time.monotonic() < deadline, _status(services, cid)
            time.sleep(0.1)


def test_with_a_broker_a_new_job_is_published_or_kept(redis_url: str, tmp_path: Path) -> None:
    import redis

    queue = f"cka-runtime-{uuid.uuid4().hex[:10]}"
    base = make_settings(f"sqlite:///{tmp_path / 'x.db'}", tmp_path / "data")
    settings = base.model_copy(update={"broker_url": redis_url, "celery_queue": queue})
    runtime = compose(settings, threads=4)
    client = redis.Redis.from_url(redis_url)
    try:
        assert runtime.worker is None  # the Celery workers run the jobs
        runtime.services.dispatch(7)
        assert client.llen(queue) == 1
    finally:
        client.delete(queue)
        client.close()
        runtime.close()
    away = compose(settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"}))
    try:
        away.services.dispatch(7)  # logged, not raised: a worker's reaper publishes it later
    finally:
        away.close()
    idle = compose(Settings(data_dir=tmp_path / "idle", broker_url=None), threads=0)
    assert idle.worker is None and idle.services.dispatch is nowhere
    idle.close()


def _status(services: Services, comparison_id: int) -> str:
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        assert cmp is not None
        return str(cmp.job.status)
