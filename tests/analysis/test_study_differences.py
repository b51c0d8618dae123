"""Study differences: the crossed-seed interval covers, the variance is the model's, the summary.

The simulated studies are drawn here from the two-way crossed random-effects model
Y[i, j] = r_i + c_j + e_ij (reference seed i, arm seed j), the two arms sharing the reference
seeds with correlated effects; the true difference is 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analysis import studies
from analysis.studies.differences import (
    ArmTable,
    baseline_pseudo_values,
    crossed_difference,
    study_differences,
)
from analysis.studies.results import differences, matched_entry

N = 3


def two_arms(
    rng: np.random.Generator, s_r: float, s_c: float, s_e: float, rho: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    r = rng.multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]], size=N) * s_r
    a = 0.8 + r[:, :1] + s_c * rng.standard_normal((1, N)) + s_e * rng.standard_normal((N, N))
    b = 0.8 + r[:, 1:] + s_c * rng.standard_normal((1, N)) + s_e * rng.standard_normal((N, N))
    return a, b


def test_interval_covers_95_percent_of_simulated_3x3_studies_where_pair_t_does_not() -> None:
    rng = np.random.default_rng(20)
    studies_n = 2000
    crossed = pairs_t = 0
    for _ in range(studies_n):
        a, b = two_arms(rng, 0.01, 0.01, 0.01)
        d = crossed_difference(a.mean(1) - b.mean(1), [a, b])
        assert d.estimate == pytest.approx(a.mean() - b.mean(), abs=1e-12)
        crossed += d.low <= 0.0 <= d.high
        diffs = (a - b).ravel()
        half = stats.t.ppf(0.975, diffs.size - 1) * diffs.std(ddof=1) / np.sqrt(diffs.size)
        pairs_t += abs(diffs.mean()) <= half
    assert 0.93 <= crossed / studies_n <= 0.97
    assert pairs_t / studies_n < 0.85  # the 9 pairs share models: far too narrow


def test_variance_estimate_is_unbiased_for_the_crossed_model() -> None:
    # Without truncation, s_z²/n + Σ(MS_C − MS_E)/(n·n) has expectation
    # Var(r_A − r_B)/n + σ_c²/n · 2 + σ_e²/(n·n) · 2 (written out here from the model).
    rng = np.random.default_rng(7)
    s_r, s_c, s_e, rho = 0.02, 0.01, 0.015, 0.5
    truth = 2 * (1 - rho) * s_r**2 / N + 2 * s_c**2 / N + 2 * s_e**2 / (N * N)
    estimates, squared = [], []
    for _ in range(6000):
        a, b = two_arms(rng, s_r, s_c, s_e, rho)
        z = a.mean(1) - b.mean(1)
        v = z.var(ddof=1) / N
        for t in (a, b):
            cols = N * ((t.mean(0) - t.mean()) ** 2).sum() / (N - 1)
            resid = t - t.mean(1, keepdims=True) - t.mean(0, keepdims=True) + t.mean()
            v += (cols - (resid**2).sum() / ((N - 1) ** 2)) / (N * N)
        estimates.append(v)
        squared.append(z.mean() ** 2)
    assert np.mean(estimates) == pytest.approx(truth, rel=0.05)
    assert np.mean(squared) == pytest.approx(truth, rel=0.06)  # and it is Var(D)


def test_baseline_pseudo_values_are_the_jackknife_over_reference_seeds() -> None:
    pairs = np.array([[np.nan, 0.8, 0.7], [0.8, np.nan, 0.9], [0.7, 0.9, np.nan]])
    pseudo = baseline_pseudo_values(pairs)
    # n·mean − (n − 1)·(the one pair left without seed i)
    assert pseudo == pytest.approx([0.8 + 0.7 - 0.9, 0.8 + 0.9 - 0.7, 0.7 + 0.9 - 0.8])
    assert pseudo.mean() == pytest.approx(0.8)


def test_a_clear_difference_is_decided_and_no_difference_is_not() -> None:
    rng = np.random.default_rng(3)
    a, b = two_arms(rng, 0.01, 0.005, 0.005)
    far = crossed_difference(a.mean(1) - (b - 0.2).mean(1), [a, b - 0.2])
    assert far.low > 0 and far.p_value < 0.01
    same = crossed_difference(np.zeros(N), [np.full((N, N), 0.5), np.full((N, N), 0.5)])
    assert (same.estimate, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    wider = crossed_difference(a.mean(1) - b.mean(1), [a, b], input_var=0.02**2)
    plain = crossed_difference(a.mean(1) - b.mean(1), [a, b])
    assert wider.high - wider.low > plain.high - plain.low


def test_matched_point_of_the_builtin_studies() -> None:
    assert matched_entry(studies.plan("sparsity", seeds=1)) == "sw_mlp[density=0.046875]"
    width = studies.plan("width", seeds=1)
    name = matched_entry(width)
    entry = next(e for e in width.entries if e.name == name)
    assert entry.family == "sw_mlp" and entry.structure["effective_width"] == 512
    assert entry.structure["omega"] == width.reference.structure["omega"]


def test_study_differences_cover_every_arm_against_matched_and_baseline() -> None:
    rng = np.random.default_rng(5)
    base = rng.uniform(0.7, 0.8, size=(N, N))
    base = np.triu(base, 1) + np.triu(base, 1).T
    np.fill_diagonal(base, np.nan)
    m, other = rng.uniform(0.8, 0.9, size=(N, N)), rng.uniform(0.6, 0.7, size=(N, N))
    arms = [
        ArmTable("m", m, 0.01),
        ArmTable("x", other, 0.02),
        ArmTable("itself", base.copy(), None, is_reference=True),
    ]
    out = study_differences(arms, ArmTable("seed_to_seed", base, 0.01), "m")
    got = {(d["arm"], d["versus"]): d for d in out}
    assert set(got) == {("m", "seed_to_seed"), ("x", "m"), ("x", "seed_to_seed"), ("itself", "m")}
    upper = base[np.triu_indices(N, 1)]
    assert got["x", "m"]["estimate"] == pytest.approx(other.mean() - m.mean())
    assert got["x", "seed_to_seed"]["estimate"] == pytest.approx(other.mean() - upper.mean())
    assert got["itself", "m"]["estimate"] == pytest.approx(upper.mean() - m.mean())
    assert got["x", "m"]["input_se"] == pytest.approx(np.hypot(0.02, 0.01))
    # the reference's own models are compared as the baseline is, with its input noise
    assert got["itself", "m"]["input_se"] == pytest.approx(np.hypot(0.01, 0.01))
    for d in out:
        assert d["low"] <= d["estimate"] <= d["high"] and 0 < d["p_value"] <= 1


def test_differences_over_the_same_images_use_the_paired_image_variance() -> None:
    rng = np.random.default_rng(8)
    base = rng.uniform(0.7, 0.8, size=(N, N))
    base = np.triu(base, 1) + np.triu(base, 1).T
    np.fill_diagonal(base, np.nan)
    m, x = rng.uniform(0.8, 0.9, size=(N, N)), rng.uniform(0.6, 0.7, size=(N, N))
    shared = rng.normal(0, 1e-3, 450)  # the images move every table together...
    terms = {k: shared + rng.normal(0, 2e-4, 450) for k in ("m", "x", "base")}  # ...and apart
    arms = [ArmTable("m", m, 0.03, image_terms=terms["m"]), ArmTable("x", x, 0.03)]
    baseline = ArmTable("seed_to_seed", base, 0.03, image_terms=terms["base"])
    got = {(d["arm"], d["versus"]): d for d in study_differences(arms, baseline, "m")}
    paired = got["m", "seed_to_seed"]
    assert paired["images"] == "paired"
    assert paired["input_se"] == pytest.approx(np.sqrt(np.sum((terms["m"] - terms["base"]) ** 2)))
    assert paired["variance"]["images"] == pytest.approx(paired["input_se"] ** 2)
    # x has no per-image terms (an older summary): the sum of the two tables' se², said so
    assert got["x", "m"]["images"] == "summed"
    assert got["x", "m"]["input_se"] == pytest.approx(np.hypot(0.03, 0.03))
    # the terms must be over the same images: 449 against 450 are not paired
    short = ArmTable("x", x, 0.03, image_terms=terms["x"][:449])
    other = study_differences([arms[0], short], baseline, "m")
    assert next(d for d in other if d["arm"] == "x" and d["versus"] == "m")["images"] == "summed"


def test_summary_differences_recompute_from_the_stored_tables() -> None:
    from tests.analysis.test_studies import FakeAtlas, finished

    plan = studies.plan("sparsity", seeds=3)
    done = finished(plan)
    summary = studies.summarize(plan, done, FakeAtlas([d["name"] for d in done])).summary
    assert summary["matched"] == "sw_mlp[density=0.046875]"
    assert differences(summary) == summary["differences"]
    versus = {(d["arm"], d["versus"]) for d in summary["differences"]}
    assert len(versus) == 2 * len(summary["arms"]) - 1  # the matched arm not with itself
    pair = ("mlp", "sw_mlp[density=0.046875]")
    mlp = next(d for d in summary["differences"] if (d["arm"], d["versus"]) == pair)
    arm = {a["name"]: a["cka_diagonal"]["mean"] for a in summary["arms"]}
    assert mlp["estimate"] == pytest.approx(arm["mlp"] - arm["sw_mlp[density=0.046875]"])
