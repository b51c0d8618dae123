"""Verdicts and q-values against formulas written here, and compare's baselines in the library.

The learned interval is ``(T - mean) ± t_{0.975, ν} √V`` with ``V = v + s²/k`` and the
Welch–Satterthwaite ``ν = V² (k - 1) / (s²/k)²``; the seed interval ``(T - C) ± 1.96 √v``. The
image term ``v`` is paired where the comparison kept its cells' per-image projections φ:
``Σ_a (φ_T − mean_k φ_U_k)²`` and ``Σ_a (φ_T − φ_C)²``; summed where it kept none: ``se²`` and
``se² + se_C²``, ``se`` the cell's interval half-width over 1.96. A verdict is decided when the
interval lies on one side of 0, "level" when it stays within the margin (0.05) on the question's
side, undecided when it covers both 0 and the margin.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

import analysis
import models
from analysis.batch_statistics import cell_image_terms
from analysis.engine.streaming import RunSettings
from analysis.inference.verdicts import atlas_q_values, learned, seed_gap
from analysis.shards.shard import combine, run_partial

Z = 1.959963984540054
MARGIN = 0.05


def _learned_rule(low: np.ndarray, high: np.ndarray) -> list[str]:
    return [
        "above_untrained" if lo > 0 else "not_above_untrained" if hi < MARGIN else "undecided"
        for lo, hi in zip(low, high, strict=True)
    ]


def _seed_rule(low: np.ndarray, high: np.ndarray) -> list[str]:
    return [
        "below_seed_ceiling" if hi < 0 else "within_seed_spread" if lo > -MARGIN else "undecided"
        for lo, hi in zip(low, high, strict=True)
    ]


def test_learned_counts_the_images_and_the_twins_spread() -> None:
    value = np.array([0.90, 0.82, 0.80, 0.75])
    half = np.array([0.02, 0.01, 0.03, 0.02])  # the cells' image intervals, value ± half
    floor = np.array([0.70, 0.80, 0.82, 0.72])  # the twins' mean over 3 draws
    sd = np.array([0.03, 0.004, 0.01, 0.06])  # their standard deviation over the draws
    got = learned(value, value - half, value + half, floor, sd, 3)

    se = half / Z
    v = se**2 + sd**2 / 3
    nu = v**2 * 2 / (sd**2 / 3) ** 2
    reach = stats.t.ppf(0.975, nu) * np.sqrt(v)
    np.testing.assert_allclose(got.difference, value - floor, atol=1e-15)
    np.testing.assert_allclose(got.low, value - floor - reach, rtol=1e-9)
    np.testing.assert_allclose(got.high, value - floor + reach, rtol=1e-9)
    assert list(got.verdict) == _learned_rule(got.low, got.high)
    # one of each: a clear gain, a small one the interval still sees, a loss within the
    # margin, and a spread of twins too wide to tell
    assert list(got.verdict) == [
        "above_untrained",
        "above_untrained",
        "not_above_untrained",
        "undecided",
    ]


def test_learned_with_one_draw_or_no_baseline() -> None:
    value, low, high = np.array([0.9, 0.9]), np.array([0.89, 0.89]), np.array([0.91, 0.91])
    one = learned(value, low, high, np.array([0.1, np.nan]), None, 1)
    # one draw has no spread: nothing tells how far untrained networks vary
    assert list(one.verdict) == ["undecided", None]
    assert np.isnan(one.low).all() and np.isnan(one.high).all()
    assert one.difference[0] == pytest.approx(0.8) and np.isnan(one.difference[1])
    # the twins agreeing exactly: the images alone, with the normal quantile
    exact = learned(value, low, high, np.array([0.88, 0.88]), np.array([0.0, 0.0]), 3)
    np.testing.assert_allclose(exact.high - exact.difference, 0.01, rtol=1e-12)
    # no interval for the cell: no verdict
    bare = learned(value, np.full(2, np.nan), np.full(2, np.nan), value - 0.1, value * 0, 3)
    assert list(bare.verdict) == [None, None]


def test_the_seed_gap_counts_both_cells_images() -> None:
    value = np.array([0.90, 0.82, 0.80, 0.75])
    half = np.array([0.02, 0.01, 0.03, 0.02])
    ceiling = np.array([0.91, 0.86, 0.84, 0.70])
    ceiling_half = np.array([0.02, 0.01, 0.03, 0.02])
    got = seed_gap(
        value, value - half, value + half, ceiling, ceiling - ceiling_half, ceiling + ceiling_half
    )
    reach = Z * np.sqrt((half / Z) ** 2 + (ceiling_half / Z) ** 2)
    np.testing.assert_allclose(got.difference, value - ceiling, atol=1e-15)
    np.testing.assert_allclose(got.low, value - ceiling - reach, rtol=1e-9)
    np.testing.assert_allclose(got.high, value - ceiling + reach, rtol=1e-9)
    assert list(got.verdict) == _seed_rule(got.low, got.high)
    assert list(got.verdict) == [
        "within_seed_spread",  # level with the other seed
        "below_seed_ceiling",  # clearly lower
        "undecided",  # could be level, could be more than the margin below
        "within_seed_spread",  # higher than the other seed is within its spread too
    ]
    # a ceiling stored without its interval counts the cell's own noise for it
    bare = seed_gap(value, value - half, value + half, ceiling)
    np.testing.assert_allclose(bare.high - bare.difference, Z * np.sqrt(2) * half / Z, rtol=1e-9)


def test_q_values_are_benjamini_hochberg_over_the_atlas() -> None:
    rng = np.random.default_rng(0)
    upper = np.triu_indices(6, 1)
    p = np.zeros((6, 6))
    p[upper] = rng.uniform(0, 0.2, len(upper[0])) ** 2
    p = p + p.T
    np.fill_diagonal(p, 1e-300)  # a layer with itself is no test, whatever its p
    tests, m = p[upper], len(upper[0])
    bh = [min(min(pj * m / np.sum(tests <= pj), 1.0) for pj in tests if pj >= pi) for pi in tests]
    q = atlas_q_values(p)
    assert q is not None
    np.testing.assert_allclose(q[upper], bh, rtol=1e-12)
    np.testing.assert_array_equal(q, q.T)
    assert np.isnan(np.diag(q)).all()


# --- the library: compare(..., baselines=...) ----------------------------------------------

N, BATCH, DRAWS = 64, 32, 2


def _twin_seed(key: str, draw: int, copy: int = 0) -> int:
    digest = hashlib.sha256(f"random_init|0|{key}|{draw}|{copy}".encode()).hexdigest()
    return int(digest[:8], 16) % 2**31


def _cka(nets: dict[str, Any], data: Any, **options: Any) -> analysis.Atlas:
    return analysis.compare(nets, data, batch_size=BATCH, device="cpu", **options)


def _projections(nets: dict[str, Any], data: Any) -> np.ndarray:
    """Each image's projection (N, L, L) of every cell of ``nets``' atlas, as a run with
    baselines and image intervals keeps them (without running the baselines)."""
    opts = analysis.CompareOptions.build(
        batch_size=BATCH, interval="images", baselines=("random_init",)
    )
    atlas = combine([run_partial(nets, data, opts, None, RunSettings(device="cpu"))])
    terms: np.ndarray = atlas.values[cell_image_terms.KEY]
    return terms


def _block(terms: np.ndarray, rows: int) -> np.ndarray:
    """The first model's rows against the second's columns of a two-model atlas's terms."""
    return terms[:, :rows, rows:]


def _judge(**shortcuts: Any) -> tuple[analysis.Atlas, dict[str, Any], torch.Tensor]:
    """Two seeds of a Mixer (the second only a candidate sibling) and a gMLP, untrained."""
    nets = {
        "s0": models.create("mixer_digits", seed=0),
        "g": models.create("gmlp_digits", seed=0),
        "s1": models.create("mixer_digits", seed=1),
    }
    x = torch.randn(N, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    atlas = analysis.compare(
        {"s0": nets["s0"], "g": nets["g"]},
        x,
        batch_size=BATCH,
        device="cpu",
        baselines="random_init,seed_ceiling",
        random_init_draws=DRAWS,
        siblings={"s1": nets["s1"]},
        **shortcuts,
    )
    return atlas, nets, x


@pytest.fixture(scope="module")
def judged() -> tuple[analysis.Atlas, dict[str, Any], torch.Tensor, list[tuple[int, int]]]:
    calls: list[tuple[int, int]] = []
    atlas, nets, x = _judge(on_batch=lambda done, total: calls.append((done, total)) and None)
    return atlas, nets, x, calls


def test_compare_with_baselines_judges_every_cell(
    judged: tuple[analysis.Atlas, dict[str, Any], torch.Tensor, list[tuple[int, int]]],
) -> None:
    atlas, nets, x, _ = judged
    assert atlas.config["interval"] == "images"  # asked for by the baselines
    # the floor: untrained presets seeded as documented (keys: the labels), averaged
    draws = []
    for d in range(DRAWS):
        row = models.create("mixer_digits", seed=_twin_seed("s0", d))
        col = models.create("gmlp_digits", seed=_twin_seed("g", d))
        draws.append(_cka({"r": row, "c": col}, x).matrix("r", "c"))
    floor, sd = np.mean(draws, axis=0), np.std(draws, axis=0, ddof=1)
    np.testing.assert_allclose(atlas.baseline("random_init", "s0", "g"), floor, atol=1e-6)
    np.testing.assert_allclose(atlas.baseline_sd("s0", "g"), sd, atol=1e-6)
    # the ceiling: the sibling in s0's place, with its own image interval
    sibling = _cka({"s1": nets["s1"], "g": nets["g"]}, x, interval="images")
    ceiling = sibling.matrix("s1", "g")
    np.testing.assert_allclose(atlas.baseline("seed_ceiling", "s0", "g"), ceiling, atol=1e-6)
    assert atlas.undefined_baselines("g", "g") == {
        "seed_ceiling": "no seed sibling among the models"
    }
    # the verdicts, from the formulas above, their image terms paired: the projections of the
    # cell, of each draw's twins in its place and of the sibling in s0's, over the same images
    assert atlas.verdict_images() == {"learned": "paired", "seed": "paired"}
    rows = len(atlas.layers["s0"])
    cell = _block(_projections({"s0": nets["s0"], "g": nets["g"]}, x), rows)
    twins = [
        _block(
            _projections(
                {
                    "r": models.create("mixer_digits", seed=_twin_seed("s0", d)),
                    "c": models.create("gmlp_digits", seed=_twin_seed("g", d)),
                },
                x,
            ),
            rows,
        )
        for d in range(DRAWS)
    ]
    sibling_terms = _block(_projections({"s1": nets["s1"], "g": nets["g"]}, x), rows)
    cka, interval = atlas.matrix("s0", "g"), atlas.interval("s0", "g")
    assert interval is not None
    se = (interval[1] - interval[0]) / (2 * Z)
    # each cell's projections square to its own image interval's variance
    np.testing.assert_allclose(np.sum(cell**2, axis=0), se**2, rtol=1e-6)
    v = np.sum((cell - np.mean(twins, axis=0)) ** 2, axis=0) + sd**2 / DRAWS
    reach = stats.t.ppf(0.975, v**2 * (DRAWS - 1) / (sd**2 / DRAWS) ** 2) * np.sqrt(v)
    verdicts = atlas.verdicts("s0", "g")
    assert verdicts is not None
    np.testing.assert_allclose(verdicts["learned"], cka - floor, atol=1e-6)
    np.testing.assert_allclose(verdicts["learned_high"], cka - floor + reach, atol=1e-6)
    lows, highs = verdicts["learned_low"].ravel(), verdicts["learned_high"].ravel()
    assert list(verdicts["learned_verdict"].ravel()) == _learned_rule(lows, highs)
    reach_c = Z * np.sqrt(np.sum((cell - sibling_terms) ** 2, axis=0))
    np.testing.assert_allclose(verdicts["seed_gap_low"], cka - ceiling - reach_c, atol=1e-6)
    lows, highs = verdicts["seed_gap_low"].ravel(), verdicts["seed_gap_high"].ravel()
    assert list(verdicts["seed_verdict"].ravel()) == _seed_rule(lows, highs)
    own = atlas.verdicts("g", "g")
    assert own is not None and all(v is None for v in own["seed_verdict"].ravel())
    # a layer with itself is no question (as it is no test for the q-values)
    assert [own["learned_verdict"][k, k] for k in range(len(own["learned"]))] == [None] * len(
        own["learned"]
    )
    assert np.isnan(np.diag(own["learned"])).all()
    # q-values over the atlas; the JSON form carries all of it and reads back equal
    q = atlas.q_values("s0", "g")
    assert q is not None and np.all(q >= atlas.p_values("s0", "g"))
    again = analysis.Atlas.from_dict(atlas.to_dict())
    back = again.verdicts("s0", "g")
    assert back is not None and list(back["seed_verdict"].ravel()) == list(
        verdicts["seed_verdict"].ravel()
    )
    assert set(atlas.to_dict()["verdicts"]) >= {"learned_verdict", "seed_verdict", "margin"}
    assert again.verdict_images() == {"learned": "paired", "seed": "paired"}
    assert again.to_dict()["verdicts"]["verdict_images"] == {"learned": "paired", "seed": "paired"}
    assert cell_image_terms.KEY not in atlas.values  # kept while it ran, never stored


def test_verdicts_sum_the_image_noise_where_no_projections_were_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # over the cap (cells × images), no run keeps its projections: the unpaired terms
    monkeypatch.setattr(cell_image_terms, "MAX_CELL_IMAGE_TERMS", 0)
    atlas, nets, x = _judge()
    assert atlas.verdict_images() == {"learned": "summed", "seed": "summed"}
    assert atlas.to_dict()["verdicts"]["verdict_images"] == {"learned": "summed", "seed": "summed"}
    assert "image_var" not in atlas.baselines["random_init"]  # type: ignore[index]
    cka, interval = atlas.matrix("s0", "g"), atlas.interval("s0", "g")
    assert interval is not None
    se = (interval[1] - interval[0]) / (2 * Z)
    floor, sd = atlas.baseline("random_init", "s0", "g"), atlas.baseline_sd("s0", "g")
    assert floor is not None and sd is not None
    v = se**2 + sd**2 / DRAWS
    reach = stats.t.ppf(0.975, v**2 * (DRAWS - 1) / (sd**2 / DRAWS) ** 2) * np.sqrt(v)
    verdicts = atlas.verdicts("s0", "g")
    assert verdicts is not None
    np.testing.assert_allclose(verdicts["learned_high"], cka - floor + reach, atol=1e-6)
    ceiling = atlas.baseline("seed_ceiling", "s0", "g")
    sibling = _cka({"s1": nets["s1"], "g": nets["g"]}, x, interval="images")
    ci_c = sibling.interval("s1", "g")
    assert ceiling is not None and ci_c is not None
    reach_c = Z * np.sqrt(se**2 + ((ci_c[1] - ci_c[0]) / (2 * Z)) ** 2)
    np.testing.assert_allclose(verdicts["seed_gap_low"], cka - ceiling - reach_c, atol=1e-6)


def test_progress_counts_every_phase(
    judged: tuple[analysis.Atlas, dict[str, Any], torch.Tensor, list[tuple[int, int]]],
) -> None:
    _, _, _, calls = judged
    batches = N // BATCH
    # phases: 2 models; 2 draws of 2 twins of each; 3 stand-ins (the sibling, s0, g); every
    # batch of each, then the last unit once the result is complete
    weights = [2, DRAWS * 2 * 2, 3]
    assert len(calls) == batches * (1 + DRAWS + 1) + 1
    fractions = [done / total for done, total in calls]
    assert fractions == sorted(fractions)
    assert fractions[batches - 1] == pytest.approx(weights[0] / sum(weights))
    assert fractions[-1] == 1.0 and max(fractions[:-1]) < 1.0
    assert calls[-2][0] == calls[-1][0] - 1  # the last batch counted all but the last unit
