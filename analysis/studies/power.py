"""Power of a study's differences: what its seeds could detect, and how many seeds would.

Every difference of a study rests on the variance components of the crossed model that
:mod:`analysis.studies.differences` estimates from the study's own tables
(:class:`~analysis.studies.differences.Components`): ``ρ`` (``rows``: the paired reference-seed
effect), ``σ_ck²`` and ``σ_ek²`` (``columns``, ``residuals``: arm-seed effect and residual of
each of the k = 1 or 2 arm tables in the difference) and ``v_img`` (``images``: the images'
sampling noise). With n seeds — the reference's and every arm's, as a study trains them — the
variance of a difference scales as the components do with the seeds::

    V(n) = (ρ + Σ_k σ_ek²/n)/n + Σ_k σ_ck²/n + v_img
         = (ρ + Σ_k σ_ck²)/n  +  Σ_k σ_ek²/n²  +  v_img

the reference-seed and arm-seed effects shrinking with the seeds of one model, the residual
with the seeds of both (it is averaged over the n × n pairs), the images' noise not at all (every
model sees the same images; ``v_img`` is the paired variance of the difference's per-image
projections where the pilot has them, :mod:`analysis.inference.paired_images`, else the sum of
the two sides'). Against the seed-to-seed baseline ``ρ`` holds the baseline's own
residual too (the jackknife's Efron–Stein bound), which really shrinks as 1/n²: scaled as 1/n
here, the seeds planned there are, like the interval, on the safe side.

**Power.** A study decides a difference when its interval ``D̂ ± q·√V̂`` is clear of 0. Under the
model ``D̂ ~ N(Δ, V)`` independently of ``V̂``, whose mean squares are independent scaled χ²
variables (:func:`~analysis.studies.differences.variance_draws`, the same draws that calibrate
the interval), so at a true difference Δ with n seeds the power is::

    π(Δ, n) = E[ Φ(Δ/√V − q·√(V̂/V)) + Φ(−Δ/√V − q·√(V̂/V)) ]

over ``DRAWS`` draws of ``V̂``, with ``q`` the (1 − α) quantile of ``|Z|·√(V/V̂)`` — the
interval's own quantile. With one mean square this is the noncentral t's power; here ``V̂`` is a
sum of mean squares with a negative coefficient, so the draws stand in for Satterthwaite's
degrees of freedom (which would overstate the quantile). With unlimited seeds ``V̂ → V → v_img``
and ``q → z₁₋α/₂``: the normal approximation, so no number of seeds detects a difference below
the **floor** ``Δ_∞ = (z₁₋α/₂ + z_π)·√v_img`` (2.80 √v_img at α = 0.05, π = 0.8): that takes
more images (their noise shrinks as 1/√images), not more seeds.

**Answers**, each at ``POWER`` = 80 % and the study's two-sided α = 0.05 unless asked otherwise:
:func:`detectable` — the smallest |Δ| with π(Δ, n) ≥ 80 % (π rises with |Δ|; solved by Brent's
method); :func:`seeds_needed` — the fewest seeds n with π(Δ, n) ≥ 80 %, None when no count up to
``SEARCH_SEEDS`` reaches it; :func:`difference_power` — both for one difference of summary.json,
and for an undecided one whether more seeds would decide it (``more_seeds``). The planned seeds
reach 75–85 % power of the study's own decision rule in simulation
(tests/analysis/test_study_power.py). Components estimated from 3 seeds rest on 2–4 degrees of
freedom each: read a plan from a small pilot as an order of magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from analysis.studies.differences import DRAWS, Components, variance_draws
from analysis.studies.spec import MAX_SEEDS, MAX_TRAININGS, StudyError

__all__ = [
    "ALPHA",
    "LEVEL",
    "MORE_SEEDS",
    "POWER",
    "SEARCH_SEEDS",
    "check_detect",
    "detectable",
    "difference_power",
    "floor",
    "max_seeds",
    "power",
    "power_settings",
    "seeds_needed",
]

POWER = 0.80
ALPHA = 0.05  # two-sided, the study's 95 % intervals (analysis.studies.differences)
LEVEL = 1.0 - ALPHA
SEARCH_SEEDS = 1000
# An undecided difference, if it is as observed: the seeds a study may train decide it; more
# than a study of this size may train would; or no number of seeds would (below the floor).
MORE_SEEDS = ("would_decide", "beyond_a_study", "would_not")


def _check(target: float, level: float) -> None:
    if not 0.0 < target < 1.0 or not math.isfinite(target):
        raise StudyError(f"power must be between 0 and 1 (exclusive), not {target}")
    if not 0.0 < level < 1.0 or not math.isfinite(level):
        raise StudyError(f"level must be between 0 and 1 (exclusive), not {level}")


def check_detect(detect: float | None) -> float | None:
    """A target difference in diagonal CKA: None, or a number in (0, 1]."""
    if detect is None:
        return None
    if not math.isfinite(detect) or not 0.0 < detect <= 1.0:
        raise StudyError(f"the difference to detect must be in (0, 1], not {detect}")
    return float(detect)


def _design(parts: Components, seeds: int, arms: Sequence[int] | None) -> list[int]:
    return [seeds] * len(parts.columns) if arms is None else list(arms)


class _Curve:
    """π(Δ) at one design: V, the draws of √(V̂/V) and the interval's quantile q."""

    def __init__(
        self, parts: Components, seeds: int, arms: Sequence[int] | None, level: float, seed: int
    ) -> None:
        design = _design(parts, seeds, arms)
        self.possible = seeds >= parts.min_seeds and min(design, default=2) >= 2
        self.sd = math.sqrt(parts.variance(seeds, design)) if self.possible else math.nan
        if not self.possible or self.sd == 0.0:
            return
        rng = np.random.default_rng(seed)
        self.ratio = np.sqrt(variance_draws(parts, seeds, design, DRAWS, rng) / self.sd**2)
        q = float(np.quantile(np.abs(rng.standard_normal(DRAWS)) / self.ratio, level))
        self.critical = q * self.ratio

    def __call__(self, difference: float) -> float:
        if not self.possible:
            return 0.0
        if self.sd == 0.0:  # no spread: any difference shows, none is decided without one
            return float(difference != 0.0)
        d = abs(difference) / self.sd
        tails = special.ndtr(d - self.critical) + special.ndtr(-d - self.critical)
        return float(np.mean(tails))


def power(
    parts: Components,
    difference: float,
    seeds: int,
    arms: Sequence[int] | None = None,
    *,
    level: float = LEVEL,
    seed: int = 0,
) -> float:
    """π(Δ, n): the chance the study decides a true ``difference`` with ``seeds`` reference
    seeds and ``arms`` seeds in each arm table (default: ``seeds`` in each); 0 where the seeds
    allow no interval."""
    return _Curve(parts, seeds, arms, level, seed)(difference)


def detectable(
    parts: Components,
    seeds: int,
    arms: Sequence[int] | None = None,
    *,
    level: float = LEVEL,
    target: float = POWER,
    seed: int = 0,
) -> float | None:
    """The smallest |Δ| decided with probability ``target`` at that design; None where the
    seeds allow no interval."""
    _check(target, level)
    curve = _Curve(parts, seeds, arms, level, seed)
    if not curve.possible:
        return None
    if curve.sd == 0.0:
        return 0.0
    high = float(curve.critical.max()) + 10.0  # in units of √V: π(high) ≈ 1
    root = optimize.brentq(lambda d: curve(d * curve.sd) - target, 0.0, high, xtol=1e-12)
    return float(root) * curve.sd


def floor(parts: Components, *, level: float = LEVEL, target: float = POWER) -> float:
    """The smallest |Δ| any number of seeds detects with probability ``target``: the images'."""
    _check(target, level)
    if parts.images <= 0.0:
        return 0.0
    z = float(stats.norm.ppf(0.5 + level / 2.0))

    def gap(d: float) -> float:
        return float(special.ndtr(d - z) + special.ndtr(-d - z)) - target

    return float(optimize.brentq(gap, 0.0, z + 10.0, xtol=1e-12)) * math.sqrt(parts.images)


def seeds_needed(
    parts: Components,
    difference: float,
    *,
    level: float = LEVEL,
    target: float = POWER,
    cap: int = SEARCH_SEEDS,
    seed: int = 0,
) -> int | None:
    """The fewest seeds (reference and every arm alike) that decide a true ``difference`` with
    probability ``target``; None when no count up to ``cap`` does."""
    _check(target, level)
    if abs(difference) <= floor(parts, level=level, target=target):
        return None

    def enough(n: int) -> bool:
        return _Curve(parts, n, None, level, seed)(difference) >= target

    low = parts.min_seeds  # π rises with n: double until enough, then bisect
    if enough(low):
        return low
    high = low
    while True:
        low, high = high, min(2 * high, cap)
        if enough(high):
            break
        if high == cap:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def max_seeds(points: int) -> int:
    """The most seeds a study of ``points`` architectures (reference and grid points) may train."""
    return max(min(MAX_SEEDS, MAX_TRAININGS // max(points, 1)), 1)


def power_settings(
    summary: Mapping[str, Any],
    *,
    detect: float | None = None,
    target: float | None = None,
) -> dict[str, Any]:
    """summary.json's ``power``: the target power, α, the difference to detect and the most seeds
    a study of this size may train; ``detect`` and ``target`` override the summary's own."""
    stored = summary.get("power") or {}
    wanted = float(target if target is not None else stored.get("target") or POWER)
    alpha = float(stored.get("alpha") or ALPHA)
    _check(wanted, 1.0 - alpha)
    return {
        "target": wanted,
        "alpha": alpha,
        "detect": check_detect(detect if detect is not None else stored.get("detect")),
        "max_seeds": int(stored.get("max_seeds") or max_seeds(1 + len(summary.get("arms") or []))),
    }


def _more_seeds(item: Mapping[str, Any], needed: int | None, most: int) -> str | None:
    if item.get("decision") != "undecided":
        return None
    if needed is None:
        return "would_not"
    return "would_decide" if needed <= most else "beyond_a_study"


def difference_power(item: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """summary.json's ``power`` of one difference (an item of ``differences`` with its
    ``variance``), None without one (too few seeds for an interval).

    ``detectable``: the smallest |Δ| decided with ``target`` power at the seeds it had;
    ``floor``: the smallest with any number of seeds (the images' noise; 0 without image
    intervals); ``seeds_needed``: the seeds that decide the observed difference, were it the
    truth; ``seeds_for_detect``: the seeds that decide ``detect`` (None without a target);
    ``more_seeds`` (undecided differences only): one of :data:`MORE_SEEDS`.
    """
    variance = item.get("variance")
    if not variance:
        return None
    parts = Components.from_dict(variance)
    level, target = 1.0 - settings["alpha"], settings["target"]
    design = variance["seeds"]
    estimate = item.get("estimate")
    needed = None if estimate is None else seeds_needed(parts, estimate, level=level, target=target)
    detect = settings.get("detect")
    return {
        "detectable": detectable(
            parts, design["reference"], design["arms"], level=level, target=target
        ),
        "floor": floor(parts, level=level, target=target),
        "seeds_needed": needed,
        "detect": detect,
        "seeds_for_detect": None
        if detect is None
        else seeds_needed(parts, detect, level=level, target=target),
        "more_seeds": _more_seeds(item, needed, settings["max_seeds"]),
    }
