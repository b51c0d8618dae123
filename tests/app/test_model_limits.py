"""Architecture sizes and sidecars a client controls are bounded before anything is queued (#26).

Each option of a family has a maximum in the family's schema, and a model that fits the maxima
must still fit CKA_MAX_MODEL_BYTES (models.check_budget, sized on the meta device) before a
training, a study's trainings or a comparison is queued. Sidecars are checked by the library's
one schema (models.sidecar) at upload.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.http.main import create_app
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, make_settings, upload


def _client(db_url: str, root: Path, **settings: Any) -> Iterator[TestClient]:
    config = make_settings(db_url, root / "data", worker_threads=0, **settings)
    with TestClient(create_app(config, start_worker=False)) as client:
        yield client


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """The app with no worker: whatever is accepted stays queued."""
    yield from _client(db_url, tmp_path)


def _nothing_queued(api: TestClient) -> None:
    assert api.get("/v1/jobs").json()["total"] == 0


def test_absurd_option_size_is_refused_on_trainings(api: TestClient) -> None:
    body = {"arch": "mixer_digits", "dataset_id": digits_id(api), "config": {"embed_dim": 10**6}}
    problem = assert_problem(
        api.post("/v1/trainings", json=body), 422, "invalid_config", "config.embed_dim"
    )
    assert "less than or equal to 8192" in problem["detail"]
    _nothing_queued(api)


def test_model_over_the_memory_budget_is_refused_on_trainings(api: TestClient) -> None:
    # Within every option's maximum, but 256 blocks of C = 8192 on 16 tokens: petabytes.
    config = {"embed_dim": 8192, "num_blocks": 256}
    body = {"arch": "mixer_digits", "dataset_id": digits_id(api), "config": config}
    problem = assert_problem(api.post("/v1/trainings", json=body), 422, "model_too_large", "config")
    assert "more than the 16.0 GiB allowed" in problem["detail"]
    assert "\n" not in problem["detail"]
    _nothing_queued(api)


def test_absurd_option_size_is_refused_in_a_study(api: TestClient) -> None:
    spec = {
        "name": "huge",
        "dataset": "digits",
        "seeds": 1,
        "reference": {"name": "mixer", "arch": "mixer_digits"},
        "arms": [{"name": "big", "arch": "mixer_digits", "options": {"embed_dim": 10**6}}],
    }
    problem = assert_problem(api.post("/v1/studies", json={"spec": spec}), 422, "invalid_study")
    assert "option 'embed_dim'" in problem["detail"]
    big = {**spec, "arms": [{**spec["arms"][0], "options": {"embed_dim": 8192, "depth": 256}}]}
    assert_problem(api.post("/v1/studies", json={"spec": big}), 422, "model_too_large", "spec")
    _nothing_queued(api)


def test_comparison_of_models_over_the_memory_budget_is_refused(
    db_url: str, tmp_path: Path, zoo: dict[str, Path]
) -> None:
    # A 1 MiB budget: a digits Mixer's activations at batch size 64 are about 13 MB.
    for api in _client(db_url, tmp_path, max_model_bytes=1 << 20):
        ids = [upload(api, zoo[name]).json()["id"] for name in ("mixer_digits", "mlp_digits")]
        body = {"model_ids": ids, "dataset_id": digits_id(api), "batch_size": 64}
        problem = assert_problem(
            api.post("/v1/comparisons", json=body), 422, "model_too_large", "model_ids.0"
        )
        assert "to run at batch size 64" in problem["detail"]
        _nothing_queued(api)


def _job_bytes(n: int, pixels: int, widths: list[int], batch: int) -> int:
    """What a minibatch comparison of CKA alone holds (analysis.comparison.memory), written out:
    its images as float32, a batch's features, and a batch's Grams with their centred copies
    in float64."""
    return n * pixels * 4 + batch * sum(widths) * 4 + 2 * len(widths) * batch * batch * 8


def test_comparison_over_the_job_memory_is_refused(
    db_url: str, tmp_path: Path, zoo: dict[str, Path]
) -> None:
    # Each model's stem: 16 tokens of 32 channels, 512 features an image.
    for api in _client(db_url, tmp_path / "probe"):
        ds = api.get(f"/v1/datasets/{digits_id(api)}").json()
    need = _job_bytes(ds["n"], 8 * 8, [512, 512], 16)
    for limit, status in ((need - 1024, 422), (need + 1024, 202)):
        for api in _client(db_url, tmp_path / str(status), job_memory_gb=limit / 2**30):
            ids = [upload(api, zoo[name]).json()["id"] for name in ("mixer_digits", "mlp_digits")]
            body = {"model_ids": ids, "dataset_id": ds["id"], "batch_size": 16, "layers": "stem"}
            r = api.post("/v1/comparisons", json=body)
            if status == 202:
                assert r.status_code == 202, r.text
                continue
            problem = assert_problem(r, 422, "job_too_large", "dataset_id")
            assert f"about {need / 2**20:.2f} MiB (images" in problem["detail"]
            assert "CKA_JOB_MEMORY_GB" in problem["detail"] and "\n" not in problem["detail"]
            _nothing_queued(api)


def test_sidecar_with_a_string_accuracy_is_refused_at_upload(
    api: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    weights = zoo["mixer_digits"]
    sidecar = json.loads(weights.with_suffix(".json").read_text())
    sidecar["metrics"] = {"test": {"accuracy": "ninety percent"}}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(sidecar))
    with weights.open("rb") as w, bad.open("rb") as s:
        files = {"weights": ("w.safetensors", w), "sidecar": ("s.json", s)}
        r = api.post("/v1/models", files=files)
    problem = assert_problem(r, 422, "invalid_checkpoint", "sidecar")
    assert "metrics.test.accuracy" in problem["detail"] and "\n" not in problem["detail"]
    assert api.get("/v1/models").json()["total"] == 0
    assert api.get("/models").status_code == 200
