"""Coverage of the study differences' 95 % intervals on simulated crossed-seed studies.

python bench/bench_differences.py [--studies 2000] [--seed 0]

Each simulated study has 3 reference seeds and 3 seeds per arm. The diagonal-CKA table of an arm
is ``μ + r_i + c_j + e_ij`` (reference seed i, arm seed j); the two arms' reference effects are
correlated (ρ = 0.5: one reference model), the seed-to-seed table is ``μ_0 + u_i + u_k + f_ik``
with u correlated to the arms' r likewise. The true difference is known (0), so coverage is the
share of studies whose interval holds it. Printed per setting of (σ_r, σ_c, σ_e):

* ``crossed``: :func:`analysis.studies.differences.crossed_difference`, arm against arm;
* ``baseline``: the same, arm against the seed-to-seed baseline (σ_f = σ_e);
* ``satterthwaite``: the same variance estimate with a Satterthwaite-df t-interval;
* ``pairs t``: the t-interval over the 9 paired (reference seed, arm seed) differences;
* ``arm t``: today's t-interval over one arm's 9 pairs, as an interval for that arm's mean;
* ``+ input``: ``crossed`` with image noise shared by each table's cells (sd 0.01, correlated
  0.5 between the arms) and the per-cell se given: conservative by construction.

Not a timing benchmark: the whole simulation runs once (one job of :func:`harness.interleaved`,
no warm-up, for the seconds it took), then :func:`harness.finish` gives the machine line and,
with ``--json PATH``, keeps the coverage figures with it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import harness  # bench/harness.py, beside this script
import numpy as np
from scipy import stats

from analysis.studies.differences import (
    baseline_pseudo_values,
    crossed_difference,
    mean_squares,
)

SETTINGS = [
    (0.01, 0.01, 0.01),
    (0.02, 0.005, 0.005),
    (0.005, 0.02, 0.005),
    (0.005, 0.005, 0.02),
    (0.0, 0.0, 0.01),
    (0.01, 0.0, 0.0),
]
N_SEEDS = 3
RHO = 0.5


def _t_covers(values: np.ndarray, truth: float) -> bool:
    n = values.size
    half = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return bool(abs(values.mean() - truth) <= half)


def _satterthwaite_covers(a: np.ndarray, b: np.ndarray) -> bool:
    z = a.mean(1) - b.mean(1)
    n = N_SEEDS
    terms = [(z.var(ddof=1) / n, n - 1)]
    for t in (a, b):
        c, e = mean_squares(t)
        if c.value > e.value:
            terms += [(c.value / (n * n), c.df), (-e.value / (n * n), e.df)]
    v = sum(x for x, _ in terms)
    df = v**2 / sum(x**2 / k for x, k in terms)
    return bool(abs(z.mean()) <= stats.t.ppf(0.975, df) * np.sqrt(v))


def _covers(low: float | None, high: float | None) -> bool:
    return low is not None and high is not None and low <= 0.0 <= high


def simulate(
    sigmas: tuple[float, float, float], studies: int, rng: np.random.Generator
) -> dict[str, float]:
    s_r, s_c, s_e = sigmas
    n = N_SEEDS
    cov = np.full((3, 3), RHO) + (1 - RHO) * np.eye(3)
    hits = dict.fromkeys(("crossed", "baseline", "satterthwaite", "pairs t", "arm t", "+ input"), 0)
    for _ in range(studies):
        r = rng.multivariate_normal(np.zeros(3), cov * s_r**2, size=n)  # arm A, arm B, u
        a = r[:, :1] + s_c * rng.standard_normal((1, n)) + s_e * rng.standard_normal((n, n))
        b = r[:, 1:2] + s_c * rng.standard_normal((1, n)) + s_e * rng.standard_normal((n, n))
        u = r[:, 2]
        base = u[:, None] + u[None, :] + s_e * rng.standard_normal((n, n))
        base = np.triu(base, 1) + np.triu(base, 1).T
        d = crossed_difference(a.mean(1) - b.mean(1), [a, b])
        hits["crossed"] += _covers(d.low, d.high)
        # the arm's mean is 0 and the baseline's 2·E[u] = 0, so the truth is 0 again
        d0 = crossed_difference(a.mean(1) - baseline_pseudo_values(base), [a])
        hits["baseline"] += _covers(d0.low, d0.high)
        hits["satterthwaite"] += _satterthwaite_covers(a, b)
        hits["pairs t"] += _t_covers((a - b).ravel(), 0.0)
        hits["arm t"] += _t_covers(a.ravel(), 0.0)
        shared = rng.multivariate_normal([0, 0], [[1, 0.5], [0.5, 1]]) * 0.01
        ai, bi = a + shared[0], b + shared[1]
        di = crossed_difference(ai.mean(1) - bi.mean(1), [ai, bi], input_var=2 * 0.01**2)
        hits["+ input"] += _covers(di.low, di.high)
    return {k: v / studies for k, v in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures and the machine here")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    names = ("crossed", "baseline", "satterthwaite", "pairs t", "arm t", "+ input")
    print(f"{args.studies} simulated 3×3-seed studies per row; coverage of nominal 95 % intervals")
    print("| σ_r | σ_c | σ_e | " + " | ".join(names) + " |")
    print("|---:|---:|---:|" + "---:|" * len(names))
    rows = []

    def every_setting() -> None:
        for sigmas in SETTINGS:
            cover = simulate(sigmas, args.studies, rng)
            cells = " | ".join(f"{100 * cover[k]:.1f} %" for k in names)
            print(f"| {sigmas[0]} | {sigmas[1]} | {sigmas[2]} | {cells} |")
            rows.append({"sigmas": list(sigmas), "coverage": cover})

    timed = harness.interleaved({"simulation": every_setting}, 1, warm_up=False)
    print(f"({timed['simulation'].stat('wall'):.1f} s)")
    harness.finish(args.json, {"studies": args.studies, "seed": args.seed, "rows": rows}, timed)


if __name__ == "__main__":
    main()
