"""``/v1/jobs``: every job whatever its kind, filters, pagination, and cancel mid-training."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

import app.jobs.train as train_job
from app.jobs.queue import claim, enqueue
from app.jobs.run import run_claimed
from app.store.orm import Model, Training
from app.store.services import Services
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, register


def _services(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


def test_jobs_of_every_kind_with_filters_and_pages(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    client = idle_client
    ds = digits_id(client)
    ids = register(client, zoo, "mlp_digits", "mixer_digits")
    cmp_a = client.post("/v1/comparisons", json={"model_ids": ids, "dataset_id": ds}).json()
    cmp_b = client.post("/v1/comparisons", json={"model_ids": ids[:1], "dataset_id": ds}).json()
    tr = client.post("/v1/trainings", json={"arch": "mlp_digits", "dataset_id": ds}).json()
    with _services(client).db.session() as s:  # a kind this code has no handler for yet
        study = enqueue(s, "study").id

    page = client.get("/v1/jobs").json()
    assert page["total"] == 4
    assert [j["kind"] for j in page["items"]] == ["study", "training", "comparison", "comparison"]
    assert all(j["status"] == "queued" and j["attempts"] == 0 for j in page["items"])
    by_kind = {j["kind"]: j for j in page["items"]}
    assert by_kind["training"]["links"]["training"] == f"/v1/trainings/{tr['id']}"
    assert "comparison" not in by_kind["study"]["links"]
    assert client.get("/v1/jobs/kinds").json() == {"kinds": ["comparison", "study", "training"]}

    comparisons = client.get("/v1/jobs", params={"kind": "comparison"}).json()
    assert comparisons["total"] == 2
    assert {j["links"]["comparison"] for j in comparisons["items"]} == {
        f"/v1/comparisons/{cmp_a['id']}",
        f"/v1/comparisons/{cmp_b['id']}",
    }
    assert client.get("/v1/jobs", params={"kind": "study"}).json()["items"][0]["id"] == study

    cancelled = client.post(f"/v1/jobs/{study}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    assert client.get("/v1/jobs", params={"status": "cancelled"}).json()["total"] == 1
    assert client.get("/v1/jobs", params={"status": "queued"}).json()["total"] == 3
    queued_comparisons = {"kind": "comparison", "status": "queued"}
    assert client.get("/v1/jobs", params=queued_comparisons).json()["total"] == 2

    seen = []
    for offset in range(0, 5, 2):
        chunk = client.get("/v1/jobs", params={"limit": 2, "offset": offset}).json()
        assert chunk["total"] == 4 and chunk["limit"] == 2 and chunk["offset"] == offset
        seen += [j["id"] for j in chunk["items"]]
    assert seen == [j["id"] for j in page["items"]]

    assert_problem(client.get("/v1/jobs/999999"), 404, "not_found")
    assert_problem(client.post("/v1/jobs/999999/cancel"), 404, "not_found")
    assert_problem(client.get("/v1/jobs", params={"status": "lost"}), 422, "validation_error")


def test_training_cancelled_mid_run_registers_and_leaves_no_checkpoint(
    idle_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = idle_client
    services = _services(client)
    epochs, batch, cancel_at = 3, 64, 4
    train_images = 1347  # the digits train split
    total = epochs * math.ceil(train_images / batch)
    body = {"arch": "mlp_digits", "dataset_id": digits_id(client), "epochs": epochs}
    tr = client.post("/v1/trainings", json=body | {"batch_size": batch}).json()
    models_before = client.get("/v1/models").json()["total"]
    steps: list[tuple[int, int]] = []
    real_train = train_job.train

    def train(*args: Any, on_step: Any, **kw: Any) -> Any:
        def hook(done: int, total_steps: int) -> bool:
            steps.append((done, total_steps))
            if done < cancel_at:
                return bool(on_step(done, total_steps))
            if done == cancel_at:  # cancel through the API, then wait for the job to see it
                job_id = client.get(f"/v1/trainings/{tr['id']}").json()
                assert job_id["status"] == "running"
                jobs_page = client.get("/v1/jobs", params={"kind": "training"}).json()
                assert client.post(f"/v1/jobs/{jobs_page['items'][0]['id']}/cancel").is_success
                deadline = time.monotonic() + 60
                while on_step(done, total_steps) and time.monotonic() < deadline:
                    time.sleep(0.02)
            return bool(on_step(done, total_steps))

        return real_train(*args, on_step=hook, **kw)

    monkeypatch.setattr(train_job, "train", train)
    job = claim(services.db, "test-worker")
    assert job is not None
    run_claimed(services, job, "test-worker")

    # It stopped right after the step during which it was cancelled, long before the end.
    assert steps[0] == (0, total) and steps[-1] == (cancel_at, total)
    view = client.get(f"/v1/trainings/{tr['id']}").json()
    assert view["status"] == "cancelled" and view["model_id"] is None
    listed = client.get(f"/v1/jobs/{job.id}").json()
    assert listed["status"] == "cancelled" and listed["worker"] == "test-worker"
    assert 0 < listed["progress"] < 1
    assert client.get("/v1/models").json()["total"] == models_before
    with services.db.session() as s:
        assert s.scalar(select(func.count()).select_from(Model)) == models_before
        assert s.get(Training, tr["id"]).model_id is None  # type: ignore[union-attr]
    root = services.store.root
    assert list(root.rglob("*.safetensors")) == [] and list(root.rglob("*.tmp")) == []
    assert list(services.store.tmp.iterdir()) == []  # the scratch directory is gone
