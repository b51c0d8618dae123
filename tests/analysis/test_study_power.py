"""Power of study differences: the planned seeds reach the planned power, the pieces are right.

Simulated studies are drawn here from the crossed random-effects model that
analysis/studies/differences.py assumes: an arm's table is Y[i, j] = μ + r_i + c_j + e_ij + ε
(reference seed i, arm seed j, ε the images' noise shared by the table's cells), the arms'
reference effects r and the seed-to-seed baseline's u correlated (one reference model); the
baseline table is μ_0 + u_i + u_k + ε_0 (no residual of its own, so its jackknife is exact).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from analysis import studies
from analysis.studies import power as P
from analysis.studies.differences import ArmTable, Components, components, study_differences
from analysis.studies.pilot import plan_seeds
from analysis.studies.results import differences

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "docs" / "study-sparsity-3seeds.json"
RHO = 0.5


def arm_vs_arm(s_r: float, s_c: float, s_e: float, se: float) -> Components:
    """The truth for arm B − arm A: Var(r_B − r_A) = 2(1 − ρ)σ_r², each table's σ_c², σ_e²."""
    return Components(2 * (1 - RHO) * s_r**2, (s_c**2,) * 2, (s_e**2,) * 2, 2 * se**2, 2)


def arm_vs_baseline(s_r: float, s_c: float, s_e: float, se: float) -> Components:
    """The truth for arm B − the seed-to-seed baseline: Var(r_B − 2u) = (5 − 4ρ)σ_r²."""
    return Components((5 - 4 * RHO) * s_r**2, (s_c**2,), (s_e**2,), 2 * se**2, 3)


def simulate(
    n: int, studies_n: int, sigmas: tuple[float, float, float, float], truth: tuple[float, float]
) -> dict[tuple[str, str], float]:
    """The share of simulated n-seed studies whose summary decides B − A and B − baseline.

    ``truth``: (μ_B − μ_A, μ_B − μ_0 − 2E[u]); every study goes through study_differences and
    its decision, the summary's own path."""
    s_r, s_c, s_e, se = sigmas
    rng = np.random.default_rng(11)
    cov = (np.full((3, 3), RHO) + (1 - RHO) * np.eye(3)) * s_r**2
    r = rng.multivariate_normal(np.zeros(3), cov, size=(studies_n, n))

    def table(k: int, mean: float) -> np.ndarray:
        cols = s_c * rng.standard_normal((studies_n, 1, n))
        resid = s_e * rng.standard_normal((studies_n, n, n))
        return mean + r[:, :, k, None] + cols + resid + se * rng.standard_normal((studies_n, 1, 1))

    a, b = table(0, 0.8), table(1, 0.8 + truth[0])
    u = r[:, :, 2]
    base = 0.8 + truth[0] - truth[1] + u[:, :, None] + u[:, None, :]
    base = base + se * rng.standard_normal((studies_n, 1, 1))
    base[:, np.arange(n), np.arange(n)] = np.nan
    decided = {("b", "a"): 0, ("b", "seed_to_seed"): 0}
    for k in range(studies_n):
        arms = [ArmTable("a", a[k], se), ArmTable("b", b[k], se)]
        for d in study_differences(arms, ArmTable("seed_to_seed", base[k], se), "a"):
            if (d["arm"], d["versus"]) in decided:
                decided[d["arm"], d["versus"]] += d["decision"] in ("closer", "farther")
    return {key: hits / studies_n for key, hits in decided.items()}


def test_the_planned_seeds_reach_80_percent_power_of_the_study_s_own_decision() -> None:
    # The residual (shrinking with the seeds of both models) outweighs the seed effects (with
    # those of one): a planner that scaled it as 1/n would plan a far larger difference.
    sigmas = (0.01, 0.006, 0.03, 0.004)
    n = 6
    crossed, baseline = arm_vs_arm(*sigmas), arm_vs_baseline(*sigmas)
    truth = []
    for parts in (crossed, baseline):
        delta = P.detectable(parts, n)
        assert delta is not None
        delta *= 1.0001  # just above the smallest difference n seeds detect at 80 %
        assert P.seeds_needed(parts, delta) == n  # the planner asks for exactly these seeds
        assert P.power(parts, delta, n) == pytest.approx(0.8, abs=1e-3)
        truth.append(delta)
    power = simulate(n, 800, sigmas, (truth[0], truth[1]))
    assert 0.75 <= power["b", "a"] <= 0.85, power
    assert 0.75 <= power["b", "seed_to_seed"] <= 0.85, power


def test_components_from_tables_are_the_model_s_on_average() -> None:
    # The mean of the estimates over many 3 × 3 pilots, against the components drawn with.
    s_r, s_c, s_e = 0.02, 0.012, 0.01
    rng = np.random.default_rng(4)
    draws = []
    for _ in range(3000):
        r = rng.multivariate_normal([0, 0], [[1, RHO], [RHO, 1]], size=3) * s_r
        a, b = (
            r[:, k : k + 1] + s_c * rng.standard_normal((1, 3)) + s_e * rng.standard_normal((3, 3))
            for k in (0, 1)
        )
        c = components(b.mean(1) - a.mean(1), [b, a])
        draws.append([c.rows, *c.columns, *c.residuals])
    mean = np.mean(draws, axis=0)
    # truncation at 0 leaves a small upward bias on the components that can be negative
    assert mean[0] == pytest.approx(2 * (1 - RHO) * s_r**2, rel=0.1)
    assert mean[1:3] == pytest.approx([s_c**2] * 2, rel=0.1)
    assert mean[3:] == pytest.approx([s_e**2] * 2, rel=0.05)


def test_variance_scales_with_the_seeds_as_its_components_do() -> None:
    parts = Components(4e-4, (1e-4, 2e-4), (9e-4, 4e-4), 5e-5, 2)
    for n in (2, 3, 7, 40):
        expected = (4e-4 + 3e-4) / n + (9e-4 + 4e-4) / n**2 + 5e-5
        assert parts.variance(n, [n, n]) == pytest.approx(expected, rel=1e-12)
    # a design of its own per side: rows and residual shares by the reference's seeds
    expected = (4e-4 + 9e-4 / 5 + 4e-4 / 2) / 3 + 1e-4 / 5 + 2e-4 / 2 + 5e-5
    assert parts.variance(3, [5, 2]) == pytest.approx(expected, rel=1e-12)


def test_power_has_its_limits_the_floor_and_the_normal_approximation() -> None:
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)  # 2.80: the other tail is ~1e-6
    only_images = Components(0.0, (0.0,), (0.0,), 1e-4, 2)
    assert P.floor(only_images) == pytest.approx(z * 0.01, rel=1e-4)
    assert P.floor(Components(1e-4, (1e-4,), (1e-4,), 0.0, 3)) == 0.0
    parts = Components(2e-4, (5e-5, 5e-5), (4e-4, 4e-4), 1e-5, 2)
    shrinking = [P.detectable(parts, n) for n in (2, 3, 5, 10, 30, 300)]
    assert all(x > y for x, y in itertools.pairwise(shrinking))
    # many seeds: V̂ is nearly exact and the detectable difference is the normal one
    assert shrinking[-1] == pytest.approx(z * math.sqrt(parts.variance(300, [300, 300])), rel=0.02)
    assert shrinking[-1] > P.floor(parts)
    # few seeds: the interval's wide quantile costs power, far beyond 2.80 standard errors
    assert shrinking[0] > 1.5 * z * math.sqrt(parts.variance(2, [2, 2]))
    assert P.detectable(Components(1e-4, (), (), 0.0, 3), 2) is None  # no interval at 2 seeds
    assert P.seeds_needed(parts, P.floor(parts) * 0.99) is None  # below the floor: never
    assert P.power(parts, 0.0, 5) == pytest.approx(0.05, abs=0.01)  # no difference: α
    with pytest.raises(studies.StudyError, match="between 0 and 1"):
        P.detectable(parts, 3, target=1.2)


def test_every_difference_of_a_summary_carries_its_power() -> None:
    from tests.analysis.test_studies import FakeAtlas, finished

    spec = studies.load_spec("sparsity").model_copy(update={"detect": 0.05})
    plan = studies.plan(spec, seeds=3)
    done = finished(plan)
    summary = studies.summarize(plan, done, FakeAtlas([d["name"] for d in done])).summary
    assert summary["power"] == {"target": 0.8, "alpha": 0.05, "detect": 0.05, "max_seeds": 16}
    assert differences(summary) == summary["differences"]  # recomputed from the tables alone
    for d in summary["differences"]:
        parts = Components.from_dict(d["variance"])
        assert d["se"] ** 2 <= parts.variance(3, [3] * len(parts.columns)) + 1e-15
        power = d["power"]
        assert power["detectable"] == pytest.approx(P.detectable(parts, 3), rel=1e-9)
        assert power["seeds_for_detect"] == P.seeds_needed(parts, 0.05)
        needed = power["seeds_needed"]
        assert needed == P.seeds_needed(parts, d["estimate"])
        if needed is not None:  # the least seeds with 80 % power: one fewer falls short
            assert P.power(parts, d["estimate"], needed) >= 0.8
            if needed > parts.min_seeds:
                assert P.power(parts, d["estimate"], needed - 1) < 0.8
        if d["decision"] != "undecided":
            assert power["more_seeds"] is None
        elif needed is None:
            assert power["more_seeds"] == "would_not"
        else:
            expected = "would_decide" if needed <= 16 else "beyond_a_study"
            assert power["more_seeds"] == expected


def test_the_pilot_plans_the_seeds_of_the_built_in_study() -> None:
    pilot = json.loads(PILOT.read_text(encoding="utf-8"))
    plan = plan_seeds("sparsity", pilot, detect=0.05)
    assert plan.trainings_per_seed == 8 and plan.pilot_seeds == [0, 1, 2]
    assert len(plan.asked) == len(pilot["differences"]) == 13
    needed = [d["power"]["seeds_for_detect"] for d in plan.asked]
    assert None not in needed and plan.seeds == max(needed) and not plan.out_of_reach
    assert plan.trainings(plan.seeds) == 8 * plan.seeds
    assert plan.new_trainings(plan.seeds) == 8 * (plan.seeds - 3)
    # the pilot keeps per-image terms: each floor is its paired image noise's, the |Δ| at which
    # Φ(Δ/se − z) + Φ(−Δ/se − z) = 0.8 (z = z₀.₉₇₅), below the floor of the summed bound
    unpaired = json.loads(PILOT.read_text(encoding="utf-8"))
    for stat in [a["cka_diagonal"] for a in unpaired["arms"]] + [
        unpaired["baselines"]["seed_to_seed"]
    ]:
        stat["image_terms"] = None
    summed = plan_seeds("sparsity", unpaired, detect=0.05).asked
    z = stats.norm.ppf(0.975)
    for d, bound in zip(plan.asked, summed, strict=True):
        se, floor = d["input_se"], d["power"]["floor"]
        assert (d["images"], bound["images"]) == ("paired", "summed")
        reach = stats.norm.cdf(floor / se - z) + stats.norm.cdf(-floor / se - z)
        assert reach == pytest.approx(0.8, abs=1e-6)
        assert floor < bound["power"]["floor"] / 2
    # without a target: the undecided differences, as observed; 0.027 is below its floor
    observed = plan_seeds("sparsity", PILOT)
    assert {(d["arm"], d["versus"]) for d in observed.asked} == {
        (d["arm"], d["versus"]) for d in pilot["differences"] if d["decision"] == "undecided"
    }
    below = next(d for d in observed.asked if d["arm"] == "sw_mlp[density=0.25]")
    assert abs(below["estimate"]) < below["power"]["floor"] and below in observed.out_of_reach
    with pytest.raises(studies.StudyError, match="not a run of the spec 'width'"):
        plan_seeds("width", PILOT)
    no_tables = json.loads(PILOT.read_text(encoding="utf-8"))
    for arm in no_tables["arms"]:
        arm["cka_diagonal"].pop("table")
    no_tables["baselines"]["seed_to_seed"].pop("table")
    with pytest.raises(studies.StudyError, match="no per-seed tables"):
        plan_seeds("sparsity", no_tables)
    with pytest.raises(studies.StudyError, match=r"in \(0, 1\]"):
        plan_seeds("sparsity", PILOT, detect=-0.1)
