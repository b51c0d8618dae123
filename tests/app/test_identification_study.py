"""The built-in ``layer_identification`` study, quick, through the CLI, and its page.

Trainings go through :class:`tests.app.study_tools.FakeTrainer` (the model as training builds
it, without the optimisation): two seeds of mlp_digits (``--seeds 2``; the quick run's three
cost the CCA family and Procrustes more than twice the pairs of layers, over a minute here) and
four comparisons (linear, RBF at three bandwidths) over the 450 test images. The accuracies are
recomputed here from the stored comparisons by a plain loop over pairs and layers.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import analysis
from app.cli import main
from app.http.main import create_app
from app.store.orm import Comparison
from app.store.services import Services
from app.store.settings import Settings
from tests.app.study_tools import FakeTrainer
from tests.helpers import make_settings

LINEAR = ["cca_mean", "cca", "svcca", "pwcca", "linreg", "hsic", "cka", "procrustes", "mutual_knn"]
MEASURES = [*LINEAR, "cka_rbf_0.2", "cka_rbf_0.4", "cka_rbf_0.8"]


def _loop_accuracy(block_of: dict[tuple[str, str], np.ndarray], names: list[str]) -> float:
    """Mean over ordered pairs of distinct models and layers of 1/t when the row's layer is one
    of its t maxima, else 0 (a saturated measure, CCA where features outnumber images, ties)."""
    right, total = 0.0, 0
    for a, b in itertools.permutations(names, 2):
        block = block_of[a, b]
        for layer, row in enumerate(block):
            best = [j for j, v in enumerate(row) if v == max(row)]
            right += 1 / len(best) if layer in best else 0.0
            total += 1
    return right / total


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_quick_layer_identification_writes_its_table_and_shows_it(
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trainer = FakeTrainer()
    monkeypatch.setattr("app.jobs.study.train", trainer)
    data = tmp_path / "data"
    monkeypatch.setenv("CKA_DATABASE_URL", db_url)
    monkeypatch.setenv("CKA_DATA_DIR", str(data))
    monkeypatch.setenv("CKA_DEVICE", "cpu")
    out = tmp_path / "out"
    argv = ["study", "run", "layer_identification", "--quick", "--seeds", "2", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert "2 trainings, 0 reused" in capsys.readouterr().out
    assert [(arch, seed) for arch, seed, _ in trainer.calls] == [
        ("mlp_digits", s) for s in range(2)
    ]
    assert {p.name for p in out.iterdir()} >= {"summary.json", "identification.csv", "plot.svg"}

    summary = json.loads((out / "summary.json").read_text())
    items = summary["identification"]
    assert [i["measure"] for i in items] == MEASURES
    for item in items:
        assert {"measure", "accuracy", "low", "high"} <= set(item)
        assert 0.0 <= item["low"] <= item["accuracy"] <= item["high"] <= 1.0
        assert item["models"] == 2 and item["rows"] == 2 * 1 * 7  # 7 layers of mlp_digits
    ids = summary["comparison_ids"]
    assert set(ids) == {"main", "cka_rbf_0.2", "cka_rbf_0.4", "cka_rbf_0.8"}

    services = Services(Settings())
    try:
        with services.db.session(readonly=True) as s:
            found = {name: s.get(Comparison, cid) for name, cid in ids.items()}
            stored = {name: c for name, c in found.items() if c is not None and c.result}
            assert len(stored) == len(ids)
            atlases = {n: analysis.Atlas.from_dict(c.result or {}) for n, c in stored.items()}
            kernels = {n: c.kernel for n, c in stored.items()}
            label = {m.model_id: m.label for m in stored["main"].members}
    finally:
        services.close()
    assert kernels == {
        "main": "linear",
        "cka_rbf_0.2": "rbf:0.2",
        "cka_rbf_0.4": "rbf:0.4",
        "cka_rbf_0.8": "rbf:0.8",
    }
    names = [label[i] for i in summary["reference"]["model_ids"]]
    pairs = list(itertools.permutations(names, 2))
    expected = {
        "hsic": _loop_accuracy({p: atlases["main"].hsic_block(*p) for p in pairs}, names),
        "cka": _loop_accuracy({p: atlases["main"].matrix(*p) for p in pairs}, names),
    }
    for m in LINEAR[:5] + LINEAR[7:]:  # the measures beside CKA, from the same comparison
        blocks = {p: atlases["main"].matrix(*p, measure=m) for p in pairs}
        expected[m] = _loop_accuracy(blocks, names)
    for t in ("0.2", "0.4", "0.8"):
        atlas = atlases[f"cka_rbf_{t}"]
        expected[f"cka_rbf_{t}"] = _loop_accuracy({p: atlas.matrix(*p) for p in pairs}, names)
    assert {i["measure"]: i["accuracy"] for i in items} == pytest.approx(expected)

    table = (out / "identification.csv").read_text().splitlines()
    assert table[0] == "measure,accuracy,low,high,models,rows" and len(table) == 1 + len(MEASURES)
    assert "| cka |" in (out / "identification.md").read_text()

    with TestClient(create_app(make_settings(db_url, data))) as client:
        study_id = client.get("/v1/studies").json()["items"][0]["id"]
        page = client.get(f"/studies/{study_id}").text
    assert 'id="identification"' in page
    for measure in MEASURES:
        assert f'<tr data-measure="{measure}">' in page
    cka = next(i for i in items if i["measure"] == "cka")
    assert f"{100 * cka['accuracy']:.1f}" in page
