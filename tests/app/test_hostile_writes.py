"""Hostile input, round two (issue 26): one named test per attack on the HTTP side and the store.

Tampering with a stored model by re-uploading it, unbounded studies, cross-site writes in
open mode, a ``next`` that leaves the site, and labels that plots, exports and pages must
treat as text. Every test runs on SQLite and PostgreSQL (the ``db_url`` fixture) where it
touches the database.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.store.services import Services
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, register, upload, wait


def _services(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


# --- a stored model is immutable ----------------------------------------------------------


def test_reupload_with_a_changed_sidecar_leaves_the_model_and_its_comparison_unchanged(
    client: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    ids = register(client, zoo, "mixer_digits", "rp_mixer_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    first = wait(client, client.post("/v1/comparisons", json=body).headers["location"])
    assert first["status"] == "succeeded"
    before = client.get(f"/v1/comparisons/{first['id']}/result").json()["atlas"]
    model = client.get(f"/v1/models/{ids[0]}").json()
    sha = model["sha256"]
    stored = _services(client).store.path(sha, ".json")
    stored_bytes = stored.read_bytes()

    # The same weights, with a sidecar whose pipeline would change every activation.
    meta = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())
    meta["preprocessing"] = {**meta["preprocessing"], "mean": [50.0], "std": [0.01]}
    tampered = tmp_path / "tampered.safetensors"
    tampered.write_bytes(zoo["mixer_digits"].read_bytes())
    tampered.with_suffix(".json").write_text(json.dumps(meta))
    body_409 = assert_problem(upload(client, tampered), 409, "model_exists", "sidecar")
    assert "preprocessing.mean" in body_409["detail"] and "preprocessing.std" in body_409["detail"]

    assert stored.read_bytes() == stored_bytes  # nothing written over the stored sidecar
    assert client.get(f"/v1/models/{ids[0]}").json() == model
    again = client.post("/v1/comparisons", json=body | {"force": True})
    second = wait(client, again.headers["location"])
    assert second["status"] == "succeeded" and second["id"] != first["id"]
    after = client.get(f"/v1/comparisons/{second['id']}/result").json()["atlas"]
    assert after["hsic"] == before["hsic"]

    # The same sidecar again (a re-save: only the file's own fields differ) is the same model.
    resaved = dict(json.loads(zoo["mixer_digits"].with_suffix(".json").read_text()))
    resaved["created"] = "2030-01-01T00:00:00Z"
    tampered.with_suffix(".json").write_text(json.dumps(resaved))
    r = upload(client, tampered)
    assert r.status_code == 200 and r.json()["id"] == ids[0]
    assert stored.read_bytes() == stored_bytes


# --- sizes bounded where they are parsed --------------------------------------------------

TINY = {
    "name": "tiny",
    "dataset": "digits",
    "seeds": 1,
    "reference": {"name": "mixer", "arch": "mixer_digits"},
    "arms": [{"name": "rp", "arch": "rp_mixer_digits"}],
}


def test_a_million_study_seeds_are_refused_before_anything_is_expanded(
    idle_client: TestClient,
) -> None:
    for seeds in (1_000_000, 3_000_000, 10**18):
        started = time.perf_counter()
        r = idle_client.post("/v1/studies", json={"spec": {**TINY, "seeds": seeds}})
        took = time.perf_counter() - started
        body = assert_problem(r, 422, "invalid_study")
        assert "seeds" in body["detail"] and took < 0.5, (body, took)
    # A list of seeds is bounded by its length, and so is a grid by its points, counted.
    many = list(range(129))
    r = idle_client.post("/v1/studies", json={"spec": {**TINY, "seeds": many}})
    assert "seeds" in assert_problem(r, 422, "invalid_study")["detail"]
    grid = {"density": [0.1] * 100, "depth": list(range(100)), "num_blocks": list(range(100))}
    arms = [{"name": "sw", "arch": "sw_mlp_digits", "grid": grid}]
    started = time.perf_counter()
    r = idle_client.post("/v1/studies", json={"spec": {**TINY, "arms": arms}})
    assert time.perf_counter() - started < 0.5
    assert "1000001 architectures" in assert_problem(r, 422, "invalid_study")["detail"]
    assert idle_client.get("/v1/studies").json()["total"] == 0


@pytest.mark.parametrize(
    ("recipe", "field"),
    [
        ({"epochs": 100_000_000}, "epochs"),
        ({"batch_size": 10**9}, "batch_size"),
        ({"lr": 1e9}, "lr"),
    ],
)
def test_absurd_study_recipes_are_refused_with_the_trainings_limits(
    idle_client: TestClient, recipe: dict[str, Any], field: str
) -> None:
    for spec in ({**TINY, "recipe": recipe}, {**TINY, "quick": recipe}):
        r = idle_client.post("/v1/studies", json={"spec": spec, "quick": True})
        assert field in assert_problem(r, 422, "invalid_study")["detail"]
    arms = [{"name": "rp", "arch": "rp_mixer_digits", "recipe": recipe}]
    r = idle_client.post("/v1/studies", json={"spec": {**TINY, "arms": arms}})
    assert_problem(r, 422, "invalid_study")
    # The same value over /v1/trainings: the same limit.
    body = {"arch": "mixer_digits", "dataset_id": digits_id(idle_client), **recipe}
    assert_problem(idle_client.post("/v1/trainings", json=body), 422, "validation_error", field)
    assert idle_client.get("/v1/studies").json()["total"] == 0
