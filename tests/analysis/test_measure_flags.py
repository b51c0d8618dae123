"""Each measure's flags on the case they are for: layers as wide as the sample, few images.

The expectations are the rules of docs/measures.md written out here from the layers' widths:
over n images a layer of d features has centred rank min(d, n − 1) (the random networks' layers
are generic), CCA is degenerate where two ranks add past n − 1, linear regression saturated
where a side spans the sample (rank n − 1), Procrustes where both do, and mutual k-NN has few
images where k ≥ 0.1 · (n − 1).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import analysis
from analysis.plot import render_atlas
from tests.analysis.test_measures_engine import LAYERS, TOL, _images, _nets

N = 8  # images: a's layers are 9, 7 and 5 wide, b's 6, 6 and 4
WIDTHS = {"a": [9, 7, 5], "b": [6, 6, 4]}
ASKED = ("cca", "linreg", "procrustes", "mutual_knn")


def _few(k: int = 3) -> analysis.Atlas:
    return analysis.compare(
        _nets(), _images()[:N], batch_size=N, layers=LAYERS, measures=ASKED, knn_k=k, device="cpu"
    )


def _expected(a: str, b: str, k: int = 3) -> dict[str, np.ndarray]:
    ra = np.array([min(d, N - 1) for d in WIDTHS[a]])[:, None]
    rb = np.array([min(d, N - 1) for d in WIDTHS[b]])[None, :]
    spans_a, spans_b = ra == N - 1, rb == N - 1
    shape = (len(WIDTHS[a]), len(WIDTHS[b]))
    return {
        "cca_degenerate": ra + rb > N - 1,
        "linreg_saturated": spans_a | spans_b,
        "procrustes_saturated": spans_a & spans_b,
        "mutual_knn_few_images": np.full(shape, k >= 0.1 * (N - 1)),
    }


def test_wide_layers_over_few_images_raise_each_measure_s_flags_where_the_rules_say() -> None:
    atlas = _few()
    assert atlas.diagnostics["measures"]["ranks"] == {
        m: [min(d, N - 1) for d in w] for m, w in WIDTHS.items()
    }
    owner = {"cca": "cca_degenerate", "linreg": "linreg_saturated"}
    owner |= {"procrustes": "procrustes_saturated", "mutual_knn": "mutual_knn_few_images"}
    for a, b in atlas.pairs():
        want = _expected(a, b)
        for measure, flag in owner.items():
            got = atlas.flagged(measure, a, b)
            assert list(got) == [flag], measure
            assert np.array_equal(got[flag], want[flag]), (measure, a, b)
        assert atlas.flagged("cka", a, b) == {}
    # both sides spanning the sample: each is fitted from the other exactly
    both = _expected("a", "a")["procrustes_saturated"]
    assert atlas.matrix("a", "a", "linreg")[both] == pytest.approx(1.0, abs=TOL)
    assert both.sum() == 4 and not _expected("a", "b")["procrustes_saturated"].any()
    assert _expected("a", "b")["linreg_saturated"].sum() == 6  # a's two spanning rows


def test_many_images_raise_no_flag_and_no_warning() -> None:
    atlas = analysis.compare(
        _nets(), _images(), batch_size=30, layers=LAYERS, measures=ASKED, device="cpu"
    )
    for measure in ASKED:
        for a, b in atlas.pairs():
            assert not any(v.any() for v in atlas.flagged(measure, a, b).values()), measure
    assert not any("saturated" in w or "degenerate" in w or "k-NN" in w for w in atlas.warnings)


def test_flags_are_stored_warned_and_read_back() -> None:
    atlas = _few()
    data = atlas.to_dict()
    for flag in ("cca_degenerate", "linreg_saturated", "procrustes_saturated"):
        assert isinstance(data[flag], list) and len(data[flag]) == 6
    assert "mutual_knn_few_images" in data
    again = analysis.Atlas.from_dict(data)
    for measure in ASKED:
        for flag, cells in atlas.flagged(measure, "a", "b").items():
            assert np.array_equal(again.flagged(measure, "a", "b")[flag], cells)
    said = " ".join(atlas.warnings)
    # each flagged layer pair once: the upper triangle of the (6, 6) atlas, diagonal included
    full = np.block([[_expected(a, b)["linreg_saturated"] for b in "ab"] for a in "ab"]).astype(int)
    count = (full.sum() + np.trace(full)) // 2
    assert f"linear regression is saturated in {count} cells" in said
    assert "Procrustes is saturated" in said and "mutual k-NN has few images" in said
    listed = atlas.diagnostics["measures"]["flags"]["linreg_saturated"]
    assert len(listed) == count


def _marks(svg: bytes) -> list[str]:
    return re.findall(r'id="(flagged-[0-9-]+)"', svg.decode())


def test_the_heatmap_hatches_the_flagged_cells_and_says_so() -> None:
    atlas = _few()
    for measure, flag in (("linreg", "linreg_saturated"), ("cca", "cca_degenerate")):
        svg = render_atlas(atlas, "svg", measure=measure)
        want = [
            f"flagged-{i}-{j}-{r}-{c}"
            for i, a in enumerate("ab")
            for j, b in enumerate("ab")
            for r, c in zip(*_expected(a, b)[flag].nonzero(), strict=True)
        ]
        assert sorted(_marks(svg)) == sorted(want), measure
        assert b"hatched: " in svg
    plain = render_atlas(atlas, "svg")
    assert _marks(plain) == [] and b"hatched" not in plain
    # the PNG draws the same marks: without the flags stored it differs
    bare = analysis.Atlas.from_dict(atlas.to_dict())
    del bare.values["linreg_saturated"]
    assert render_atlas(bare, measure="linreg") != render_atlas(atlas, measure="linreg")
    assert _marks(render_atlas(bare, "svg", measure="linreg")) == []
