"""Decisions over the cells of an atlas: q-values, and each cell's verdicts against its baselines.

Everything here takes plain (L, L) matrices of a measure — its values, their 95 % interval, the
p-values of its null, its baselines — and nothing about how they were computed, so a measure
other than CKA gets q-values and verdicts from the same functions.

**q-values** (:func:`atlas_q_values`): Benjamini–Hochberg over the atlas's tests, every pair of
distinct layers once (a symmetric p-matrix read above its diagonal); a layer with itself is no
test (NaN).

**Verdicts** (:func:`cell_verdicts`). A cell's value ``T`` has a 95 % interval ``[lo, hi]``;
its standard error is read back from it as ``se = (hi - lo) / (2 · 1.96)`` (the image-level
interval is ``T ± 1.96 se`` by construction; for a percentile interval this is the usual normal
reading of its width).

``learned = T − mean(U_1..U_k)``, the value minus the mean of the untrained twins' ``k`` draws
(``random_init_draws``), whose standard deviation over the draws is ``s``. Its variance counts
both sources: ``V = v_img + s²/k`` — the images that gave ``T`` and the twins, and how well ``k``
draws pin down what untrained networks give. With a few draws ``s`` is itself uncertain, so the
interval is ``learned ± t_{0.975, ν} √V`` with the Welch–Satterthwaite degrees of freedom
``ν = V² (k − 1) / (s²/k)²`` (the image term, estimated from hundreds of images, counts as
exact): with 3 draws and the twins' spread dominating, ``t`` is near 4.3, not 1.96. One draw
gives no spread at all: the interval is unbounded and the verdict undecided.

``seed_gap = T − C``, the value minus the seed ceiling ``C`` (the cell with a model replaced by
a seed sibling), with ``V = v_img`` and the normal quantile: ``seed_gap ± 1.96 √V``. It counts
the images, not the spread between seeds: one sibling is one seed (a third seed in the store
gives a second ceiling to compare with).

**The image term ``v_img``: paired, or summed.** The twins and the sibling run over the same
images as the cell, so both sides of each difference are sums over the same images of their
first-order projections (:mod:`analysis.inference.paired_images`), and the difference's image
variance is that of the difference of the projections, image by image:
``v_img = Σ_a (φ_T,a − mean_k φ_U_k,a)²`` for ``learned`` and ``Σ_a (φ_T,a − φ_C,a)²`` for
``seed_gap``. A comparison with baselines and image intervals keeps the projections of its
cells and of its baselines' runs while it runs (:mod:`analysis.batch_statistics.cell_image_terms`)
and stores each baseline's per-cell ``image_var``; the verdicts are then ``paired``. Where it has
none (the projections would exceed their memory cap, batch-bootstrap intervals, results stored
before), or for a cell whose ``image_var`` is undefined, the image term is the unpaired one:
for ``learned`` the cell's own ``se²`` (the twins' image noise is not counted), for ``seed_gap``
the sum ``se² + se_C²`` (``se_C`` from the ceiling's own interval; where it has none ``se_C =
se``: the same measure over the same images), as if the two sides' images were independent. The
sum counts the images' shared part twice, so it is, if anything, too wide; the
verdicts say which they used (``verdict_images``: ``paired`` or ``summed`` per question).

Each verdict asks one question and answers it three ways, with one rule for "undecided": the
interval contains both 0 and the margin on the side the question is about (``MARGIN``, 0.05 on
the measure's scale), so it is too wide to tell.

========================  =======================  ==========================================
verdict                   when                     reads
========================  =======================  ==========================================
``above_untrained``       ``lo > 0``               training raised the similarity
``not_above_untrained``   ``lo ≤ 0``, ``hi < m``   any learned part is smaller than ``m``
``undecided``             ``lo ≤ 0``, ``hi ≥ m``   could be none, could be ``m`` or more
``below_seed_ceiling``    ``hi < 0``               lower than another seed gets
``within_seed_spread``    ``hi ≥ 0``, ``lo > −m``  as high as another seed, to within ``m``
``undecided``             ``hi ≥ 0``, ``lo ≤ −m``  could be level, could be ``m`` or more below
========================  =======================  ==========================================

(``lo``/``hi`` the interval of the difference, ``m`` the margin.) A cell without an interval, a
baseline or a defined value has no verdict (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from analysis.inference.null_moments import q_values

__all__ = [
    "LEVEL",
    "MARGIN",
    "MARKS",
    "VERDICT_KEYS",
    "WORDS",
    "Judged",
    "LearnedVerdict",
    "SeedVerdict",
    "atlas_q_values",
    "cell_verdicts",
    "learned",
    "seed_gap",
    "verdict_images",
    "verdicts_from_json",
    "verdicts_json",
]

LEVEL = 0.95
# The margin of "too wide to tell", on the measure's scale (CKA lies in [0, 1]).
MARGIN = 0.05

LearnedVerdict = Literal["above_untrained", "not_above_untrained", "undecided"]
SeedVerdict = Literal["within_seed_spread", "below_seed_ceiling", "undecided"]

# Every per-cell array of the verdicts, in the order of the long table's columns.
VERDICT_KEYS = (
    "learned",
    "learned_low",
    "learned_high",
    "learned_verdict",
    "seed_gap",
    "seed_gap_low",
    "seed_gap_high",
    "seed_verdict",
)
# Each verdict in words and as one mark, per question (the page, the CLI and the docs say them
# the same way).
WORDS: dict[str, dict[str, str]] = {
    "learned": {
        "above_untrained": "above untrained twins",
        "not_above_untrained": "not above untrained twins",
        "undecided": "undecided against untrained twins",
    },
    "seed": {
        "within_seed_spread": "within seed spread",
        "below_seed_ceiling": "below the seed ceiling",
        "undecided": "undecided against the seed ceiling",
    },
}
MARKS: dict[str, dict[str, str]] = {
    "learned": {"above_untrained": "▲", "not_above_untrained": "▽", "undecided": "?"},
    "seed": {"within_seed_spread": "≈", "below_seed_ceiling": "▼", "undecided": "?"},
}


def atlas_q_values(p: np.ndarray | None) -> np.ndarray | None:
    """Benjamini–Hochberg q-values of a full symmetric p-matrix (None: None): every pair of
    distinct layers is one test, read above the diagonal; the diagonal is NaN."""
    if p is None:
        return None
    upper = np.triu(np.ones(p.shape, dtype=bool), 1)
    q = np.full(p.shape, np.nan)
    q[upper] = q_values(p[upper])
    return np.where(upper, q, q.T)


@dataclass(frozen=True)
class Judged:
    """A difference per cell with its interval and verdict (None where there is none)."""

    difference: np.ndarray
    low: np.ndarray
    high: np.ndarray
    verdict: np.ndarray  # object: a verdict string or None


def _z(level: float) -> float:
    from scipy import stats

    return float(stats.norm.ppf(0.5 + level / 2))


def _standard_error(low: np.ndarray, high: np.ndarray, level: float) -> np.ndarray:
    se: np.ndarray = (np.asarray(high, float) - np.asarray(low, float)) / (2 * _z(level))
    return se


def _judge(
    diff: np.ndarray,
    half: np.ndarray,
    decided: tuple[np.ndarray, str],
    level_with: tuple[np.ndarray, str],
    usable: np.ndarray,
) -> Judged:
    """The verdict per cell: ``decided``'s where its mask holds, else ``level_with``'s where
    that mask holds, else undecided; None where the cell is not ``usable``."""
    low, high = diff - half, diff + half
    verdict = np.full(diff.shape, "undecided", dtype=object)
    verdict[level_with[0]] = level_with[1]
    verdict[decided[0]] = decided[1]
    verdict[~usable] = None
    nan = np.full(diff.shape, np.nan)
    return Judged(
        np.where(usable, diff, nan),
        np.where(usable & np.isfinite(low), low, nan),
        np.where(usable & np.isfinite(high), high, nan),
        verdict,
    )


def _image_term(unpaired: np.ndarray, paired: np.ndarray | None) -> np.ndarray:
    """The paired image variance where a cell has it (finite), else the unpaired one."""
    if paired is None:
        return unpaired
    paired = np.asarray(paired, float)
    out: np.ndarray = np.where(np.isfinite(paired), paired, unpaired)
    return out


def learned(
    value: np.ndarray,
    ci_low: np.ndarray,
    ci_high: np.ndarray,
    floor: np.ndarray,
    floor_sd: np.ndarray | None,
    draws: int,
    *,
    image_var: np.ndarray | None = None,
    margin: float = MARGIN,
    level: float = LEVEL,
) -> Judged:
    """``value − floor`` (the untrained twins' mean over ``draws`` draws, ``floor_sd`` their
    standard deviation; None or NaN with one draw) with its Welch–Satterthwaite interval and
    the verdict ``above_untrained | not_above_untrained | undecided`` (see the module doc).
    ``image_var``: the paired image variance of the difference per cell; None, or NaN in a
    cell, for the cell's own ``se²``."""
    from scipy import stats

    diff = np.asarray(value, float) - np.asarray(floor, float)
    se = _standard_error(ci_low, ci_high, level)
    sd = np.full(diff.shape, np.nan) if floor_sd is None else np.asarray(floor_sd, float)
    between = sd**2 / draws if draws > 1 else np.full(diff.shape, np.nan)
    var = _image_term(se**2, image_var) + between
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(between > 0, var**2 * (draws - 1) / between**2, np.inf)
    known = np.isfinite(var)
    half = np.full(diff.shape, np.inf)  # one draw, or a cell without its interval: unbounded
    half[known] = stats.t.ppf(0.5 + level / 2, df[known]) * np.sqrt(var[known])
    usable = np.isfinite(diff) & np.isfinite(se)
    with np.errstate(invalid="ignore"):
        return _judge(
            diff,
            half,
            (diff - half > 0, "above_untrained"),
            (diff + half < margin, "not_above_untrained"),
            usable,
        )


def seed_gap(
    value: np.ndarray,
    ci_low: np.ndarray,
    ci_high: np.ndarray,
    ceiling: np.ndarray,
    ceiling_low: np.ndarray | None = None,
    ceiling_high: np.ndarray | None = None,
    *,
    image_var: np.ndarray | None = None,
    margin: float = MARGIN,
    level: float = LEVEL,
) -> Judged:
    """``value − ceiling`` with the normal interval of both cells' image noise and the verdict
    ``within_seed_spread | below_seed_ceiling | undecided`` (see the module doc).
    ``image_var``: the paired image variance of the difference per cell; None, or NaN in a
    cell, for the sum of both cells' ``se²``."""
    diff = np.asarray(value, float) - np.asarray(ceiling, float)
    se = _standard_error(ci_low, ci_high, level)
    se_c = se
    if ceiling_low is not None and ceiling_high is not None:
        own = _standard_error(ceiling_low, ceiling_high, level)
        se_c = np.where(np.isfinite(own), own, se)
    half = _z(level) * np.sqrt(_image_term(se**2 + se_c**2, image_var))
    usable = np.isfinite(diff) & np.isfinite(half)
    with np.errstate(invalid="ignore"):
        return _judge(
            diff,
            half,
            (diff + half < 0, "below_seed_ceiling"),
            (diff - half > -margin, "within_seed_spread"),
            usable,
        )


def cell_verdicts(
    value: np.ndarray,
    ci_low: np.ndarray | None,
    ci_high: np.ndarray | None,
    *,
    random_init: tuple[np.ndarray, np.ndarray | None, int] | None = None,
    seed_ceiling: tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None = None,
    learned_images: np.ndarray | None = None,
    seed_images: np.ndarray | None = None,
    margin: float = MARGIN,
    level: float = LEVEL,
) -> dict[str, np.ndarray]:
    """Both verdicts of every cell of a full (L, L) atlas, as the arrays named in
    :data:`VERDICT_KEYS` (only those of the baselines given; none without the cells' interval).
    A layer with itself (the diagonal) is no question, as it is no test for the q-values: NaN
    and None there.

    ``random_init``: (mean, sd, draws); ``seed_ceiling``: (value, low, high), the interval
    bounds None where the ceiling has none. ``learned_images``, ``seed_images``: each
    difference's paired image variance per cell (:func:`learned`, :func:`seed_gap`), None where
    the comparison kept none (see :func:`verdict_images`).
    """
    if ci_low is None or ci_high is None:
        return {}
    value = np.array(value, dtype=float)
    np.fill_diagonal(value, np.nan)
    out: dict[str, np.ndarray] = {}
    if random_init is not None:
        mean, sd, draws = random_init
        j = learned(
            value,
            ci_low,
            ci_high,
            mean,
            sd,
            draws,
            image_var=learned_images,
            margin=margin,
            level=level,
        )
        out |= {"learned": j.difference, "learned_low": j.low, "learned_high": j.high}
        out["learned_verdict"] = j.verdict
    if seed_ceiling is not None:
        ceiling, low, high = seed_ceiling
        j = seed_gap(
            value,
            ci_low,
            ci_high,
            ceiling,
            low,
            high,
            image_var=seed_images,
            margin=margin,
            level=level,
        )
        out |= {"seed_gap": j.difference, "seed_gap_low": j.low, "seed_gap_high": j.high}
        out["seed_verdict"] = j.verdict
    return out


def verdict_images(
    arrays: Mapping[str, np.ndarray],
    learned_images: np.ndarray | None,
    seed_images: np.ndarray | None,
) -> dict[str, str]:
    """Per question :func:`cell_verdicts` answered (``learned``, ``seed``), whether its image
    term is ``paired`` (the comparison kept the difference's image variance) or ``summed``."""
    out = {}
    for question, key, images in (
        ("learned", "learned", learned_images),
        ("seed", "seed_gap", seed_images),
    ):
        if key in arrays:
            out[question] = "summed" if images is None else "paired"
    return out


def verdicts_json(
    arrays: Mapping[str, np.ndarray],
    *,
    margin: float,
    level: float,
    images: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """:func:`cell_verdicts`'s arrays as JSON (None where undefined), with the margin and level
    and, given, :func:`verdict_images` as ``verdict_images``."""
    out: dict[str, Any] = {"level": level, "margin": margin}
    if images is not None:
        out["verdict_images"] = dict(images)
    for key, full in arrays.items():
        if full.dtype == object:
            out[key] = [[v if isinstance(v, str) else None for v in row] for row in full]
        else:
            out[key] = [[float(v) if np.isfinite(v) else None for v in row] for row in full]
    return out


def verdicts_from_json(data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of :func:`verdicts_json` back (verdicts as object arrays)."""
    out: dict[str, np.ndarray] = {}
    for key in VERDICT_KEYS:
        rows = data.get(key)
        if rows is None:
            continue
        if key.endswith("_verdict"):
            out[key] = np.array(rows, dtype=object).reshape(len(rows), -1)
        else:
            out[key] = np.array(
                [[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64
            ).reshape(len(rows), -1)
    return out
