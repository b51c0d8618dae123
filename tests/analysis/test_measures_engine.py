"""The measures through the engine: ``compare(..., measures=...)``, shards, full mode, the
budget, and CKA alone unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import analysis
from analysis import CompareOptions, OptionsError, combine, compare_partial
from tests.analysis.test_measures import TOL, reference

ALL = ("cka", "cca", "cca_mean", "svcca", "pwcca", "linreg", "procrustes", "mutual_knn")
LAYERS = ["2", "4", "5"]  # after each nonlinearity, and the output


def _nets() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    # no selected layer is a linear map of the input: tied canonical correlations (the spans of
    # two such layers share directions) leave PWCCA's canonical variates undetermined
    a = nn.Sequential(
        nn.Flatten(), nn.Linear(8, 9), nn.Tanh(), nn.Linear(9, 7), nn.Tanh(), nn.Linear(7, 5)
    )
    b = nn.Sequential(
        nn.Flatten(), nn.Linear(8, 6), nn.Sigmoid(), nn.Linear(6, 6), nn.Sigmoid(), nn.Linear(6, 4)
    )
    return {"a": a.double(), "b": b.double()}  # float64 features: the reference sees the same


def _images() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(120, 2, 2, 2, generator=gen, dtype=torch.float64)


def _features(net: nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """The selected layers' outputs, run here by slicing the network (not the engine's hooks)."""
    with torch.no_grad():
        return [net[: int(i) + 1](x).numpy() for i in LAYERS]


def test_compare_gives_every_measure_as_the_reference_computes_it() -> None:
    nets, x = _nets(), _images()
    atlas = analysis.compare(nets, x, batch_size=30, layers=LAYERS, measures=ALL, device="cpu")
    fa, fb = _features(nets["a"], x), _features(nets["b"], x)
    assert atlas.measure_names == list(ALL)
    for name in ALL[1:]:
        got = atlas.matrix("a", "b", measure=name)
        want = np.array([[reference(p, q)[name] for q in fb] for p in fa])
        assert got == pytest.approx(want, abs=TOL), name
        assert np.array_equal(atlas.matrix("b", "a", measure=name), got.T)
    assert atlas.cca_degenerate("a", "b") is not None
    assert not atlas.cca_degenerate("a", "b").any()
    assert atlas.diagnostics["measures"]["ranks"] == {"a": [9, 7, 5], "b": [6, 6, 4]}
    again = analysis.Atlas.from_dict(atlas.to_dict())
    assert np.array_equal(again.matrix("a", "b", measure="pwcca"), atlas.matrix("a", "b", "pwcca"))
    entry = atlas.to_dict()["matrices"][1]
    assert (entry["a"], entry["b"]) == ("a", "b") and len(entry["procrustes"]) == 3
    with pytest.raises(KeyError, match="no measure 'linreg'"):
        analysis.compare(nets, x, batch_size=30, layers=LAYERS, device="cpu").matrix(
            "a", "b", measure="linreg"
        )


def test_cka_alone_keeps_no_features_and_is_bit_identical() -> None:
    nets, x = _nets(), _images()
    plain = compare_partial(nets, x, batch_size=30, layers=LAYERS, batches=range(4), device="cpu")
    assert plain.features is None
    wide = analysis.compare(nets, x, batch_size=30, layers=LAYERS, measures="cca", device="cpu")
    assert np.array_equal(combine([plain]).hsic, wide.hsic)
    assert "measures" not in combine([plain]).to_dict()


def test_shards_and_full_mode_give_the_same_measures() -> None:
    nets, x = _nets(), _images()
    opts = CompareOptions.build(batch_size=30, layers=LAYERS, measures=("procrustes", "cca"))
    whole = analysis.compare(nets, x, opts, device="cpu")
    parts = [
        compare_partial(nets, x, opts, batches=r, device="cpu") for r in (range(1), range(1, 4))
    ]
    split = combine(parts)
    full = analysis.compare(nets, x, opts, mode="full", device="cpu")
    for name in ("procrustes", "cca"):
        assert split.matrix("a", "b", name) == pytest.approx(whole.matrix("a", "b", name), abs=TOL)
        assert full.matrix("a", "b", name) == pytest.approx(whole.matrix("a", "b", name), abs=TOL)


def test_wide_layers_are_flagged_degenerate_with_a_warning() -> None:
    nets, x = _nets(), _images()[:6]
    atlas = analysis.compare(nets, x, batch_size=6, layers=LAYERS, measures="cca", device="cpu")
    flags = atlas.cca_degenerate("a", "b")
    assert flags is not None and flags[0, 0]  # a's first layer (9 wide) spans the 5 centred
    assert atlas.matrix("a", "b", measure="cca")[0, 0] == pytest.approx(1.0, abs=TOL)
    assert any("CCA is degenerate" in w for w in atlas.warnings)


def test_a_run_over_the_memory_budget_is_refused_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CKA_MEASURES_MEMORY_GB", "0.000001")
    nets, x = _nets(), _images()
    with pytest.raises(OptionsError) as caught:
        analysis.compare(nets, x, batch_size=30, layers=LAYERS, measures="pwcca", device="cpu")
    message = str(caught.value)
    assert caught.value.field == "measures" and message.count(". ") == 0
    assert "120 images" in message and "0.00 GiB" in message
    assert "CKA_MEASURES_MEMORY_GB" in message
    analysis.compare(nets, x, batch_size=30, layers=LAYERS, device="cpu")  # CKA alone: no limit


def test_measures_options_are_canonical_and_each_named_once() -> None:
    assert CompareOptions.build(measures=["pwcca", "cca"]).measures == ("cka", "cca", "pwcca")
    assert CompareOptions.build(measures=[]).measures == ("cka",)
    assert CompareOptions.build(measures="cka,linreg").measures == ("cka", "linreg")
    with pytest.raises(OptionsError, match="measures: cca named more than once"):
        CompareOptions.build(measures=["cca", "cca"])
    with pytest.raises(OptionsError, match=r"^measures"):
        CompareOptions.build(measures=["rsa"])


def test_a_store_that_has_every_block_still_gives_the_features(tmp_path: Path) -> None:
    nets, x = _nets(), _images()
    store = analysis.DirectoryGramCache(tmp_path)
    keys = {"a": "sha-a", "b": "sha-b"}
    plain = {"batch_size": 30, "layers": LAYERS, "device": "cpu"}
    analysis.compare(nets, x, gram_cache=store, model_keys=keys, **plain)  # stores every block
    stored = analysis.compare(nets, x, gram_cache=store, model_keys=keys, measures="cca", **plain)
    fresh = analysis.compare(nets, x, measures="cca", **plain)
    assert stored.matrix("a", "b", "cca") == pytest.approx(fresh.matrix("a", "b", "cca"), abs=TOL)
