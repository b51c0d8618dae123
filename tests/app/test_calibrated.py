"""Calibrated comparisons through the service: options, baselines, the matrix fields, exports.

Every expectation is computed here, independently of the job: the baselines by building the
untrained twin and the seed sibling with ``models.create`` and comparing them with
``analysis.compare`` directly; the exported tables are read back by pandas and set against
the stored matrices cell by cell.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

import analysis
import models
from app.cli import main
from app.store.cells import Cells
from app.store.settings import Settings
from tests.app.payloads import assert_problem
from tests.files import digits_npz, seed_checkpoints
from tests.helpers import register, upload, wait

N, BATCH, BOOT, PERM = 96, 32, 20, 30  # three batches of a small slice of digits


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digits_npz(tmp_path_factory.mktemp("data"), N)


@pytest.fixture(scope="module")
def mixers(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Untrained mixer_digits checkpoints of seeds 1 and 2: siblings of each other."""
    return seed_checkpoints(tmp_path_factory.mktemp("mixers"), "mixer_digits", (1, 2), "mixer_s{}")


def _dataset(client: TestClient, path: Path) -> int:
    r = client.post("/v1/datasets", files={"file": (path.name, path.read_bytes())})
    assert r.status_code in (200, 201), r.text
    return int(r.json()["id"])


def _cka(nets: dict[str, Any], data: Any, a: str, b: str) -> np.ndarray:
    atlas = analysis.compare(nets, data, batch_size=BATCH, device="cpu")
    return atlas.matrix(a, b)


def twin_seed(key: str, draw: int, copy: int = 0) -> int:
    """The documented seed of a random-init twin (analysis.comparison.baselines), written out
    here."""
    digest = hashlib.sha256(f"random_init|0|{key}|{draw}|{copy}".encode()).hexdigest()
    return int(digest[:8], 16) % 2**31


def random_init_draws(
    arch: tuple[str, str], keys: tuple[str, str], data: Any, draws: int = 3
) -> np.ndarray:
    """The random-init block of two models (architectures ``arch``, keys ``keys``), one array
    per draw: untrained presets seeded as documented, the second twin where keys are equal."""
    out = []
    for d in range(draws):
        row = models.create(arch[0], seed=twin_seed(keys[0], d))
        col = models.create(arch[1], seed=twin_seed(keys[1], d, int(keys[0] == keys[1])))
        out.append(_cka({"r": row, "c": col}, data, "r", "c"))
    return np.stack(out)


def _array(rows: list[list[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)


def _pivot(table: pd.DataFrame, a: str, b: str, column: str, shape: tuple[int, int]) -> np.ndarray:
    part = table[(table.model_a == a) & (table.model_b == b)]
    assert len(part) == shape[0] * shape[1]
    return part[column].to_numpy(dtype=float).reshape(shape)


def test_calibration_options_are_validated_once(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    ids = register(idle_client, zoo, "mixer_digits")
    base = {"model_ids": ids, "dataset_id": 1, "batch_size": BATCH}
    for field, value in (
        ("baselines", ["random_init", "nope"]),
        ("baselines", "random_init,bogus"),
        ("permutations", -1),
        ("permutations", 10_001),
        ("sensitivity", "maybe"),
    ):
        r = idle_client.post("/v1/comparisons", json=base | {field: value})
        assert_problem(r, 422, "validation_error")
        assert r.json()["field"].split(".")[0] == field, r.json()
    # A comma-separated string is read too; order and repetition do not matter.
    r = idle_client.post(
        "/v1/comparisons",
        json=base | {"baselines": "seed_ceiling, random_init,seed_ceiling", "permutations": 3},
    )
    assert r.status_code == 202, r.text
    params = r.json()["params"]
    assert params["baselines"] == ["random_init", "seed_ceiling"]
    assert params["permutations"] == 3 and params["sensitivity"] is False
    same = idle_client.post(
        "/v1/comparisons",
        json=base | {"baselines": ["random_init", "seed_ceiling"], "permutations": 3},
    )
    assert same.status_code == 200 and same.json()["id"] == r.json()["id"]
    for field, value in (("permutations", 10), ("sensitivity", True)):
        r2 = idle_client.post("/v1/comparisons", json=base | {field: value, "mode": "full"})
        assert_problem(r2, 422, "calibration_needs_minibatch", field)
    # Without calibration, a request hashes as before: it does not find the calibrated one.
    plain = idle_client.post("/v1/comparisons", json=base)
    assert plain.status_code == 202 and plain.json()["id"] != r.json()["id"]
    # The null: analytic by default; a count of permutations asks for shuffles; none hashes as
    # a request from before the option (which had no null), so it finds what those stored.
    assert plain.json()["params"]["null"] == "analytic"
    assert params["null"] == "permutation"
    for null, status in (("none", 202), ("analytic", 200)):
        again = idle_client.post("/v1/comparisons", json=base | {"null": null})
        assert again.status_code == status and again.json()["params"]["null"] == null
    asked = idle_client.post("/v1/comparisons", json=base | {"null": "permutation"})
    assert_problem(asked, 422, "null_needs_permutations", "null")


def test_cli_refuses_bad_calibration(
    capsys: pytest.CaptureFixture[str], mixers: dict[int, Path]
) -> None:
    argv = ["compare", str(mixers[1]), "--dataset", "digits", "--baselines", "random_init,x"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert str(exc.value).startswith("error: --baselines:")


# Intervals, verdicts and exports computed from the stored atlas: the p_method and export rows
# are checked on both databases in test_p_method.py and test_baselines.py; this one runs on one.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_baselines_interval_and_exports(
    client: TestClient,
    settings: Settings,
    zoo: dict[str, Path],
    mixers: dict[int, Path],
    small_digits: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = register(client, zoo, "gmlp_digits")
    r = upload(client, mixers[1], name="mixer_s1")
    mixer_id = r.json()["id"]
    sibling = upload(client, mixers[2], name="mixer_s2").json()["id"]
    register(client, zoo, "mixer_digits")  # seed 0: registered after seed 2, so not chosen
    dataset_id = _dataset(client, small_digits)
    r = client.post(
        "/v1/comparisons",
        json={
            "model_ids": [mixer_id, ids[0]],
            "dataset_id": dataset_id,
            "batch_size": BATCH,
            "bootstrap": BOOT,
            "permutations": PERM,
            "sensitivity": True,
            "baselines": ["seed_ceiling", "random_init"],
        },
    )
    assert r.status_code == 202, r.text
    body = wait(client, r.headers["location"])
    assert body["status"] == "succeeded", body
    siblings = body["diagnostics"]["siblings"]["mixer_s1"]
    assert [s["model_id"] for s in siblings] == [sibling, sibling + 1]  # by id
    assert "gmlp_digits" in " ".join(body["diagnostics"]["warnings"])  # no sibling for it
    url = r.headers["location"]

    # Independent expectations: the untrained twins are the presets seeded as documented,
    # three draws averaged; the sibling is the seed-2 mixer.
    data = analysis.load_dataset(small_digits)
    s1, s2 = (models.load(mixers[s])[0] for s in (1, 2))
    gmlp = models.load(zoo["gmlp_digits"])[0]
    sha = {m["name"]: m["sha256"] for m in client.get("/v1/models").json()["items"]}
    key = {"mixer_s1": sha["mixer_s1"], "gmlp_digits": sha["gmlp_digits"]}
    arch = {"mixer_s1": "mixer_digits", "gmlp_digits": "gmlp_digits"}
    pairs = [("mixer_s1", "gmlp_digits"), ("mixer_s1", "mixer_s1"), ("gmlp_digits",) * 2]
    draws = {
        (a, b): random_init_draws((arch[a], arch[b]), (key[a], key[b]), data) for a, b in pairs
    }
    expected = {
        ("mixer_s1", "gmlp_digits"): {
            "seed_ceiling": _cka({"s": s2, "g": gmlp}, data, "s", "g"),
        },
        ("mixer_s1", "mixer_s1"): {
            "seed_ceiling": _cka({"s": s2, "m": s1}, data, "s", "m"),
        },
        ("gmlp_digits", "gmlp_digits"): {},
    }
    for pair, runs in draws.items():
        expected[pair]["random_init"] = runs.mean(axis=0)
        expected[pair]["random_init_sd"] = runs.std(axis=0, ddof=1)
    boot = analysis.compare(
        {"mixer_s1": s1, "gmlp_digits": gmlp},
        data,
        batch_size=BATCH,
        bootstrap=BOOT,
        permutations=PERM,
        device="cpu",
    )
    boot_sens = analysis.compare(
        {"mixer_s1": s1, "gmlp_digits": gmlp},
        data,
        batch_size=BATCH,
        sensitivity=True,
        device="cpu",
    )
    layers = body["diagnostics"]["layers"]
    assert set(layers) == {"mixer_s1", "gmlp_digits"}
    for label in layers:
        got = [layers[label][name]["effective_dim"] for name in boot.layers[label]]
        np.testing.assert_allclose(got, boot.effective_dim(label), rtol=1e-6)
    for (a, b), want in expected.items():
        m = client.get(f"{url}/matrix", params={"a": a, "b": b}).json()
        for key, value in want.items():
            np.testing.assert_allclose(_array(m["baselines"][key]), value, atol=1e-6)
        if a == b == "gmlp_digits":
            assert all(v is None for row in m["baselines"]["seed_ceiling"] for v in row)
            why = "no seed sibling in the store"
            assert m["undefined_baselines"] == {"seed_ceiling": why}
        interval = boot.interval(a, b)
        assert interval is not None
        np.testing.assert_allclose(_array(m["ci_low"]), interval[0], atol=1e-6)
        np.testing.assert_allclose(_array(m["ci_high"]), interval[1], atol=1e-6)
        # The null: the same seed gives the same permutations; p is at least 1/(1 + P).
        p, mean = _array(m["p_value"]), _array(m["null_mean"])
        np.testing.assert_allclose(p, boot.p_values(a, b), atol=1e-12)
        np.testing.assert_allclose(mean, boot.null_mean(a, b), atol=1e-6)
        assert np.all((p >= 1 / (1 + PERM) - 1e-12) & (p <= 1))
        # Sensitivity: the larger move of CKA when either side's top component is removed.
        drop = boot_sens.without_top_pc(a, b)
        assert drop is not None
        cka = _array(m["values"])
        want = np.fmax(np.abs(drop[0] - cka), np.abs(drop[1] - cka))
        np.testing.assert_allclose(_array(m["sensitivity"]), want, atol=1e-5)
    # The transposed pair reads the same cells, transposed.
    back = client.get(f"{url}/matrix", params={"a": "gmlp_digits", "b": "mixer_s1"}).json()
    forth = client.get(f"{url}/matrix", params={"a": "mixer_s1", "b": "gmlp_digits"}).json()
    for key in ("random_init", "seed_ceiling"):
        assert _array(back["baselines"][key]).T.tolist() == _array(forth["baselines"][key]).tolist()

    # The page opens with the K×K summary: mean diagonal CKA, its averaged interval, baselines.
    page = client.get(f"/comparisons/{body['id']}").text
    start = page.index('data-a="mixer_s1" data-b="gmlp_digits"')
    cell = page[start : page.index("</button>", start)]
    diag = np.diagonal(_array(forth["values"]))
    assert f"{diag.mean():.3f}" in cell
    assert f"[{np.diagonal(_array(forth['ci_low'])).mean():.3f}," in cell
    ceiling = np.diagonal(expected[("mixer_s1", "gmlp_digits")]["seed_ceiling"]).mean()
    init = np.diagonal(_array(forth["baselines"]["random_init"])).mean()
    init_sd = np.diagonal(_array(forth["baselines"]["random_init_sd"])).mean()
    assert f"init {init:.3f} ± {init_sd:.3f}" in cell
    assert f"seed {ceiling:.3f}" in cell

    summary = client.get(f"{url}/result").json()["summary"]
    assert [[c["b"] for c in row] for row in summary] == [["mixer_s1", "gmlp_digits"]] * 2
    assert summary[0][1]["cka"] == pytest.approx(diag.mean())
    assert summary[0][1]["seed_ceiling"] == pytest.approx(ceiling)

    # Exports: the long table read back by pandas equals the stored matrices, cell for cell.
    stored = client.get(f"{url}/result").json()["atlas"]
    csv = client.get(f"{url}/cells.csv")
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    parquet = client.get(f"{url}/cells.parquet")
    assert parquet.status_code == 200 and parquet.content.startswith(b"PAR1")
    again = client.get(f"{url}/cells.csv", headers={"If-None-Match": csv.headers["etag"]})
    assert again.status_code == 304
    monkeypatch.setenv("CKA_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("CKA_DATA_DIR", str(settings.data_dir))
    out = tmp_path / "cells.parquet"
    assert main(["export", str(body["id"]), "--format", "parquet", "--out", str(out)]) == 0
    tables = {
        "rest csv": pd.read_csv(io.BytesIO(csv.content)),
        "rest parquet": pd.read_parquet(io.BytesIO(parquet.content)),
        "cli parquet": pd.read_parquet(out),
    }
    columns = ["model_a", "layer_a", "model_b", "layer_b", "measure", "value", "cca_degenerate"]
    columns += ["cka", "ci_low", "ci_high"]
    columns += ["p_value", "q_value", "null_mean"]
    rows = sum(
        len(stored["layers"][m["a"]]) * len(stored["layers"][m["b"]]) for m in stored["matrices"]
    )
    baselines = stored["baselines"]
    offsets = np.cumsum([0, *(len(stored["layers"][m]) for m in stored["models"])])
    span = {m: slice(offsets[i], offsets[i + 1]) for i, m in enumerate(stored["models"])}
    # q: Benjamini–Hochberg over every pair of distinct layers once, written out here
    p_full = _array(stored["p_value"])
    upper = np.triu_indices(len(p_full), 1)
    tests = p_full[upper]
    count = len(tests)
    bh = [
        min(min(pj * count / np.sum(tests <= pj), 1.0) for pj in tests if pj >= pi) for pi in tests
    ]
    q_full = np.full(p_full.shape, np.nan)
    q_full[upper] = bh
    q_full.T[upper] = bh
    assert np.all(q_full[upper] >= tests)
    for name, table in tables.items():
        assert list(table.columns[: len(columns)]) == columns, name
        assert len(table) == rows, name
        for m in stored["matrices"]:
            a, b = m["a"], m["b"]
            shape = (len(stored["layers"][a]), len(stored["layers"][b]))
            part = table[(table.model_a == a) & (table.model_b == b)]
            assert part.layer_a.tolist() == [
                x for x in stored["layers"][a] for _ in range(shape[1])
            ]
            assert part.layer_b.tolist() == list(stored["layers"][b]) * shape[0]
            for key in ("cka", "ci_low", "ci_high"):
                got = _pivot(table, a, b, key, shape)
                np.testing.assert_array_equal(got, _array(m[key]), err_msg=f"{name} {key}")
            for key, name in (("random_init", "cka"), ("seed_ceiling", "cka")):
                want = _array(baselines[key][name])[span[a], span[b]]
                np.testing.assert_array_equal(_pivot(table, a, b, key, shape), want)
            want = _array(baselines["random_init"]["sd"])[span[a], span[b]]
            np.testing.assert_array_equal(_pivot(table, a, b, "random_init_sd", shape), want)
            for key in ("p_value", "null_mean", "sensitivity"):
                want = Cells(stored).block(key, a, b)
                np.testing.assert_array_equal(_pivot(table, a, b, key, shape), want)
            np.testing.assert_array_equal(
                _pivot(table, a, b, "p_value", shape), _array(stored["p_value"])[span[a], span[b]]
            )
            np.testing.assert_allclose(
                _pivot(table, a, b, "q_value", shape), q_full[span[a], span[b]], rtol=1e-12
            )


def test_cli_compare_with_baselines(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    zoo: dict[str, Path],
    mixers: dict[int, Path],
    small_digits: Path,
) -> None:
    out = tmp_path / "atlas.json"
    argv = ["compare", str(mixers[1]), str(zoo["gmlp_digits"]), "--sibling", str(mixers[2])]
    argv += ["--dataset", str(small_digits), "--batch-size", str(BATCH), "--device", "cpu"]
    argv += ["--baselines", "random_init,seed_ceiling", "--random-init-draws", "2"]
    argv += ["--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    data = analysis.load_dataset(small_digits)
    s2, gmlp = models.load(mixers[2])[0], models.load(zoo["gmlp_digits"])[0]
    keys = tuple(str(models.load(p)[1]["weights_sha256"]) for p in (mixers[1], zoo["gmlp_digits"]))
    cells = Cells(result)
    a, b = "mixer_s1", "gmlp_digits"
    runs = random_init_draws(("mixer_digits", "gmlp_digits"), (keys[0], keys[1]), data, draws=2)
    want_random = runs.mean(axis=0)
    want_ceiling = _cka({"s": s2, "g": gmlp}, data, "s", "g")
    np.testing.assert_allclose(cells.block("random_init", a, b), want_random, atol=1e-6)
    np.testing.assert_allclose(cells.block("random_init_sd", a, b), runs.std(0, ddof=1), atol=1e-6)
    np.testing.assert_allclose(cells.block("seed_ceiling", a, b), want_ceiling, atol=1e-6)
    block = result["baselines"]["seed_ceiling"]["blocks"][1]
    assert (block["a"], block["b"]) == (a, b) and block["stand_ins"][0]["rows"][
        "name"
    ] == "mixer_s2"
    # The printed summary: mean diagonal of each, as the summary defines it.
    line = next(x for x in printed.splitlines() if x.split()[:2] == [a, b])
    assert f"{np.diagonal(want_random).mean():.4f}" in line
    assert f"{np.diagonal(want_ceiling).mean():.4f}" in line
