"""The layer-identification statistic against hand-built similarity blocks with known answers.

Each expectation is worked out here from the definition (for every ordered pair of distinct
models and every layer of the first, is the second's most similar layer the one at the same
depth?), and the bootstrap is checked against a plain loop over the resampled models' pairs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analysis import studies
from analysis.studies.identification import (
    atlas_options,
    check_measures,
    hits,
    identification,
    markdown_table,
)


def _depth_blocks(depths: list[list[int]], rng: np.random.Generator) -> np.ndarray:
    """sims[i, j, a, b] = 1 where model i's layer a and model j's layer b have the same true
    depth, else a random value below 0.9: each row has one clear maximum."""
    k, n = len(depths), len(depths[0])
    sims = rng.uniform(0.0, 0.9, size=(k, k, n, n))
    for i, j in itertools.product(range(k), repeat=2):
        for a, b in itertools.product(range(n), repeat=2):
            if depths[i][a] == depths[j][b]:
                sims[i, j, a, b] = 1.0
    return sims


def test_perfectly_diagonal_blocks_identify_every_layer() -> None:
    rng = np.random.default_rng(1)
    sims = _depth_blocks([list(range(5))] * 4, rng)
    result = identification("cka", sims, resamples=200)
    assert result.accuracy == 1.0 and result.low == 1.0 and result.high == 1.0
    assert result.rows == 4 * 3 * 5 and result.models == 4


def test_one_model_with_two_layers_swapped_scores_the_known_fraction() -> None:
    # Three models of 4 layers; model 2 holds its layers 0 and 1 in swapped places. Pairs
    # (0, 1) and (1, 0): 4 of 4 rows right. The four pairs with model 2: only the two layers
    # the swap leaves in place are found, 2 of 4. So (2·4 + 4·2) / (6·4) = 2/3.
    rng = np.random.default_rng(2)
    sims = _depth_blocks([[0, 1, 2, 3], [0, 1, 2, 3], [1, 0, 2, 3]], rng)
    assert identification("x", sims, resamples=0).accuracy == pytest.approx(2 / 3)
    scores = hits(sims)
    assert np.isnan(scores[0, 0]).all() and scores[0, 1].tolist() == [1, 1, 1, 1]
    assert scores[0, 2].tolist() == [0, 0, 1, 1] and scores[2, 1].tolist() == [0, 0, 1, 1]


def test_ties_score_one_over_their_size_and_nan_rows_are_left_out() -> None:
    # A saturated measure (every cell 1) ties all L = 4 layers: each row scores 1/4.
    sims = np.ones((3, 3, 4, 4))
    assert identification("cca", sims, resamples=50).accuracy == pytest.approx(0.25)
    # One row of one pair with a two-way tie holding the right layer: 1/2 for that row.
    sims = _depth_blocks([list(range(3))] * 2, np.random.default_rng(3))
    sims[0, 1, 2] = [0.0, 1.0, 1.0]
    # A row with no finite value has no answer; a NaN cell never wins.
    sims[1, 0, 0] = np.nan
    sims[1, 0, 1, 0] = np.nan
    result = identification("x", sims, resamples=0)
    # Pair (0, 1): 1 + 1 + 1/2; pair (1, 0): row 0 left out, rows 1 and 2 right.
    assert result.rows == 5 and result.accuracy == pytest.approx((2.5 + 2) / 5)


def _loop_bootstrap(scores: np.ndarray, resamples: int, seed: int) -> list[float]:
    """The bootstrap written as a loop: positions a ≠ b of the draw, pairs of one model left
    out, every answered row of every kept pair counted once per pair of positions."""
    k = scores.shape[0]
    draws = np.random.default_rng(seed).integers(0, k, size=(resamples, k))
    out = []
    for draw in draws:
        rows = [
            s
            for a, b in itertools.permutations(range(k), 2)
            if draw[a] != draw[b]
            for s in scores[draw[a], draw[b]]
            if np.isfinite(s)
        ]
        if rows:
            out.append(float(np.mean(rows)))
    return out


def test_the_interval_resamples_models_as_the_loop_does() -> None:
    rng = np.random.default_rng(4)
    k, n = 5, 6
    sims = rng.normal(size=(k, k, n, n))
    sims[..., np.arange(n), np.arange(n)] += rng.uniform(0.0, 2.5, size=(k, k, n))
    sims[2, 3, 1] = np.nan  # a row without an answer
    result = identification("x", sims, resamples=300, seed=7)
    values = _loop_bootstrap(hits(sims), 300, 7)
    low, high = np.percentile(values, [2.5, 97.5])
    assert result.low == pytest.approx(low) and result.high == pytest.approx(high)
    assert result.low is not None and result.high is not None and result.accuracy is not None
    assert result.low <= result.accuracy <= result.high
    again = identification("x", sims, resamples=300, seed=7)
    assert (again.low, again.high) == (result.low, result.high)


def test_the_interval_does_not_shrink_with_more_layers() -> None:
    # Repeating every layer's pattern (the same models, twice the layers) keeps the accuracy
    # and the interval: the unit resampled is the model, not the layer.
    rng = np.random.default_rng(5)
    sims = _depth_blocks([[0, 1, 2, 3]] * 3 + [[1, 0, 3, 2]], rng)
    scores = hits(sims)
    doubled = np.concatenate([scores, scores], axis=2)
    # hits() of blocks built to give exactly those scores: the diagonal where a score is 1.
    k, n = 4, 8
    blocks = np.zeros((k, k, n, n))
    for i, j in itertools.product(range(k), repeat=2):
        for a in range(n):
            blocks[i, j, a, a if doubled[i, j, a] == 1 else (a + 1) % n] = 1.0
    one = identification("x", sims, resamples=400, seed=0)
    two = identification("x", blocks, resamples=400, seed=0)
    assert two.accuracy == pytest.approx(one.accuracy) == pytest.approx(0.5)
    assert (two.low, two.high) == pytest.approx((one.low, one.high))
    assert one.high is not None and one.low is not None and one.high - one.low > 0.3


def test_a_resample_of_one_model_is_skipped() -> None:
    # Two models: half the draws hold one model twice and have no pair; the rest hold both,
    # whose pairs are the original ones, so every kept resample gives the accuracy itself.
    sims = _depth_blocks([[0, 1, 2], [0, 2, 1]], np.random.default_rng(6))
    result = identification("x", sims, resamples=100)
    assert result.accuracy == pytest.approx(1 / 3) == result.low == result.high


def test_measures_and_comparisons_of_the_study() -> None:
    check_measures(["cka", "hsic", "pwcca", "mutual_knn"])
    with pytest.raises(ValueError, match="listed twice"):
        check_measures(["cka", "pwcca", "cka"])
    with pytest.raises(ValueError, match="unknown measures"):
        check_measures(["cka", "nope"])
    options = atlas_options({"mode": "full"}, ["hsic", "cka"], [0.2, 0.8])
    assert options == {
        "main": {"mode": "full"},
        "cka_rbf_0.2": {"mode": "full", "kernel": "rbf:0.2"},
        "cka_rbf_0.8": {"mode": "full", "kernel": "rbf:0.8"},
    }
    assert atlas_options({}, ["cka", "pwcca"], [])["main"]["measures"] == ["cka", "pwcca"]
    table = markdown_table([{"measure": "cka", "accuracy": 0.5, "low": 0.25, "high": 0.75}])
    assert "| cka | 50.0 % | [25.0 %, 75.0 %] |" in table


def test_the_builtin_study_plans_ten_seeds_and_three_under_quick() -> None:
    full = studies.plan("layer_identification")
    quick = studies.plan("layer_identification", quick=True)
    assert full.seeds == list(range(10)) and quick.seeds == [0, 1, 2]
    assert {t.arch for t in full.trainings} == {"mlp_digits"} and not full.entries
    assert quick.trainings[0].recipe["epochs"] == 1
    assert set(full.atlases) == {"main", "cka_rbf_0.2", "cka_rbf_0.4", "cka_rbf_0.8"}
    assert full.atlases["cka_rbf_0.4"]["kernel"] == "rbf:0.4"
    assert studies.plan("layer_identification", seeds=4, quick=True).seeds == [0, 1, 2, 3]
    with pytest.raises(studies.StudyError, match="cka kernel is linear"):
        studies.load_spec(
            {
                "name": "x",
                "reference": {"name": "m", "arch": "mlp_digits"},
                "cka": {"kernel": "rbf"},
                "identification": {},
            }
        )
    with pytest.raises(studies.StudyError, match="arms is empty"):
        studies.load_spec({"name": "x", "reference": {"name": "m", "arch": "mlp_digits"}})
