"""No baseline compares a model with itself; random-init twins are independent draws.

A comparison of two seeds of one architecture is where both baselines used to fail: one fixed
twin seed made the two untrained Mixers identical (random init 1.0 on the diagonal), and the
seed ceiling of (seed a, seed b) put seed b in seed a's place (1.0 again). Expectations are
built here: twins with ``models.create`` from the seed formula the docs give, ceilings with
``analysis.compare`` on the checkpoints themselves.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

import analysis
import models
from app.store.settings import Settings
from tests.app.test_calibrated import random_init_draws
from tests.files import digits_npz, seed_checkpoints
from tests.helpers import upload, wait

N, BATCH = 64, 32
NO_OTHER = "no sibling other than the compared model"


@pytest.fixture(scope="module")
def data_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digits_npz(tmp_path_factory.mktemp("data"), N)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """mixer_digits checkpoints of seeds 1, 2 and 3: three seeds of one architecture."""
    return seed_checkpoints(tmp_path_factory.mktemp("seeds"), "mixer_digits", (1, 2, 3))


def _array(rows: list[list[float | None]] | None) -> np.ndarray:
    assert rows is not None
    return np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)


def _cka(nets: dict[str, Any], data: Any, a: str, b: str) -> np.ndarray:
    return analysis.compare(nets, data, batch_size=BATCH, device="cpu").matrix(a, b)


def _compare(client: TestClient, ids: list[int], data_path: Path, **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/datasets", files={"file": (data_path.name, data_path.read_bytes())})
    body = {"model_ids": ids, "dataset_id": r.json()["id"], "batch_size": BATCH} | extra
    r = client.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    done = wait(client, r.headers["location"])
    assert done["status"] == "succeeded", done
    return done


def _upload(client: TestClient, path: Path, name: str) -> dict[str, Any]:
    r = upload(client, path, name=name)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_two_seeds_without_a_third(
    client: TestClient, seeds: dict[int, Path], data_path: Path
) -> None:
    s1, s2 = _upload(client, seeds[1], "s1"), _upload(client, seeds[2], "s2")
    done = _compare(
        client, [s1["id"], s2["id"]], data_path, baselines=["random_init", "seed_ceiling"]
    )
    url = f"/v1/comparisons/{done['id']}"
    stored = client.get(f"{url}/result").json()["atlas"]

    # Random init: two untrained Mixers of different seeds no longer agree perfectly, and the
    # block is the mean over three documented draws, with their spread.
    data = analysis.load_dataset(data_path)
    m = client.get(f"{url}/matrix", params={"a": "s1", "b": "s2"}).json()
    runs = random_init_draws(("mixer_digits",) * 2, (s1["sha256"], s2["sha256"]), data)
    init = _array(m["baselines"]["random_init"])
    assert np.all(np.diagonal(init) < 0.999)
    np.testing.assert_allclose(init, runs.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(
        _array(m["baselines"]["random_init_sd"]), runs.std(axis=0, ddof=1), atol=1e-6
    )

    # (b) The ceiling of (s1, s2) is undefined, with its reason, in the matrix, the
    # diagnostics, the page and the export; each model's own block has one (the other seed).
    assert np.all(np.isnan(_array(m["baselines"]["seed_ceiling"])))
    assert m["undefined_baselines"] == {"seed_ceiling": NO_OTHER}
    undefined = done["diagnostics"]["undefined_baselines"]
    assert undefined == [{"baseline": "seed_ceiling", "a": "s1", "b": "s2", "reason": NO_OTHER}]
    assert any(NO_OTHER in w for w in done["diagnostics"]["warnings"])
    own = client.get(f"{url}/matrix", params={"a": "s1", "b": "s1"}).json()
    n1, n2 = models.load(seeds[1])[0], models.load(seeds[2])[0]
    want = _cka({"s2": n2, "s1": n1}, data, "s2", "s1")
    np.testing.assert_allclose(_array(own["baselines"]["seed_ceiling"]), want, atol=1e-6)
    assert own["undefined_baselines"] is None
    page = client.get(f"/comparisons/{done['id']}").text
    assert f"no seed ceiling: {NO_OTHER}" in page  # the pair's title in the glance table
    table = pd.read_csv(io.BytesIO(client.get(f"{url}/cells.csv").content))
    cross = table[(table.model_a == "s1") & (table.model_b == "s2")]
    assert len(cross) and cross.seed_ceiling.isna().all() and cross.random_init.notna().all()
    assert table[table.model_a == table.model_b].seed_ceiling.notna().all()

    # (a) No baseline block pairs a network with itself: every block's two stand-ins differ,
    # so no cell is a layer against the same model's same layer (which is exactly 1).
    for name, baseline in stored["baselines"].items():
        for block in baseline["blocks"]:
            for pair in block.get("stand_ins", []):
                assert pair["rows"]["identity"] != pair["columns"]["identity"], (name, block)
        full = _array(baseline["cka"])
        diagonal = np.diagonal(full)
        assert np.all(diagonal[np.isfinite(diagonal)] < 1 - 1e-6), name


def test_a_third_seed_is_the_ceiling(
    client: TestClient, seeds: dict[int, Path], data_path: Path
) -> None:
    ids = [_upload(client, seeds[s], f"s{s}")["id"] for s in (1, 2, 3)]
    done = _compare(client, ids[:2], data_path, baselines=["seed_ceiling"])
    url = f"/v1/comparisons/{done['id']}"
    nets = {f"s{s}": models.load(seeds[s])[0] for s in (1, 2, 3)}
    data = analysis.load_dataset(data_path)
    atlas = analysis.compare(nets, data, batch_size=BATCH, device="cpu")
    # (c) s1's first sibling by id is s2, the other side: the third seed stands in for s1.
    expected = {
        ("s1", "s2"): atlas.matrix("s3", "s2"),
        ("s1", "s1"): atlas.matrix("s2", "s1"),
        ("s2", "s2"): atlas.matrix("s1", "s2"),
    }
    for (a, b), want in expected.items():
        m = client.get(f"{url}/matrix", params={"a": a, "b": b}).json()
        np.testing.assert_allclose(_array(m["baselines"]["seed_ceiling"]), want, atol=1e-6)
        assert m["undefined_baselines"] is None
    back = client.get(f"{url}/matrix", params={"a": "s2", "b": "s1"}).json()
    np.testing.assert_allclose(
        _array(back["baselines"]["seed_ceiling"]), expected["s1", "s2"].T, atol=1e-6
    )
    assert "undefined_baselines" not in done["diagnostics"]


def test_random_init_draws_are_an_option(idle_client: TestClient, seeds: dict[int, Path]) -> None:
    s1 = _upload(idle_client, seeds[1], "s1")
    base = {"model_ids": [s1["id"]], "dataset_id": 1, "baselines": ["random_init"]}
    for bad in (0, 21, "many"):
        r = idle_client.post("/v1/comparisons", json=base | {"random_init_draws": bad})
        assert r.status_code == 422 and r.json()["field"] == "random_init_draws", r.text
    five = idle_client.post("/v1/comparisons", json=base | {"random_init_draws": 5})
    assert five.status_code == 202 and five.json()["params"]["random_init_draws"] == 5
    three = idle_client.post("/v1/comparisons", json=base)
    assert (
        three.json()["params"]["random_init_draws"] == 3 and three.json()["id"] != five.json()["id"]
    )
    # Without the random-init baseline the count changes nothing: one request, one hash.
    plain = idle_client.post("/v1/comparisons", json=base | {"baselines": []})
    again = idle_client.post(
        "/v1/comparisons", json=base | {"baselines": [], "random_init_draws": 7}
    )
    assert plain.json()["params"]["random_init_draws"] is None
    assert again.status_code == 200 and again.json()["id"] == plain.json()["id"]
    form = idle_client.get("/comparisons/new").text
    assert 'name="random_init_draws"' in form and 'max="20"' in form


def test_demo_atlas_is_calibrated(settings: Settings, tmp_path: Path) -> None:
    from app.cli.demo import setup_demo
    from app.jobs.run import execute
    from app.store.orm import Comparison, Job
    from app.store.services import Services
    from models.training import ZOO

    zoo = tmp_path / "zoo"
    for name, arch, seed in ZOO:  # untrained stand-ins: the demo finds them and trains nothing
        net = models.create(arch, seed=seed)
        models.save(net, zoo / f"{name}.safetensors", seed=seed, metrics={"test": {"accuracy": 0}})
    idle = settings.model_copy(update={"worker_threads": 0})
    job_id, _ = setup_demo(idle, zoo)
    services = Services(idle)
    try:
        assert execute(services, "w:1:test", job_id) is not None  # queues the atlas at once
        with services.db.session(readonly=True) as s:
            job = s.get(Job, job_id)
            assert job is not None and job.detail is not None
            cmp_id = job.detail["comparison_id"]
            params = s.scalars(select(Comparison).where(Comparison.id == cmp_id)).one().params
            assert not s.scalars(select(Job).where(Job.kind == "training")).all()
    finally:
        services.close()
    assert params["interval"] == "images"
    assert params["baselines"] == ["random_init", "seed_ceiling"]
    assert params["random_init_draws"] == 3
