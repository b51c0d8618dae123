"""Summary statistics of a study: pure functions of per-model metadata and CKA matrices.

For every entry (the reference, and each arm's grid point) over its seeds:

``accuracy``
    the mean test accuracy and its 95 % Student-t interval over seeds
    (mean ± t₀.₉₇₅,ₙ₋₁ · s/√n, s with n − 1 degrees of freedom; ``[null, null]`` for n < 2).
``cka_diagonal``
    for every (reference model, entry model) pair that are not the same model (same training
    key), the mean over layers of the diagonal of their CKA matrix (rows the reference's
    layers); the mean of these pair values and the same t-interval over pairs, plus
    ``per_layer``, the mean over pairs of each diagonal cell. Pairs share models, so they are
    not independent: read the interval as a description of the spread, not a test (the
    summary's ``differences``, :mod:`analysis.studies.differences`, are the tests).
``baselines.seed_to_seed``
    the same over the unordered pairs of reference models of different seeds.
``table`` (in both)
    the per-pair values as a table, rows the reference's seeds and columns the entry's (the
    reference's own for the baseline), ``null`` where a pair is a model with itself, and
    ``input_se``, the mean over pairs of each pair's image-sampling standard error (from the
    comparison's bootstrap intervals; ``null`` without them), and ``image_terms``, each test
    image's first-order projection of the table's mean (the mean over its pairs of the atlas's
    :meth:`analysis.Atlas.image_terms`; ``null`` when the atlas kept none), which lets two
    tables over the same images be differenced image by image
    (:mod:`analysis.inference.paired_images`). The differences between arms
    (:mod:`analysis.studies.differences`) are computed from these tables alone.

The diagonal needs square blocks (equal layer counts); an entry whose models have another
number of layers than the reference gets ``null`` there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from scipy import stats

__all__ = [
    "AtlasLike",
    "ModelRecord",
    "diagonal_summary",
    "pair_diagonals",
    "pair_table",
    "seed_to_seed_diagonals",
    "t_interval",
    "table_image_terms",
]

LEVEL = 0.95
Z975 = float(stats.norm.ppf(0.975))


class AtlasLike(Protocol):
    """What the summary reads of an :class:`analysis.Atlas`: layer names and CKA blocks."""

    layers: Mapping[str, Sequence[str]]

    def matrix(self, a: str, b: str | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class ModelRecord:
    """One trained model of the study: its atlas name, training key, entry, seed, accuracy."""

    name: str
    key: str
    entry: str
    seed: int
    accuracy: float | None


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def t_interval(values: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """``{"mean", "ci": [lo, hi], "n"}``: the Student-t interval of the mean of ``values``.

    NaN values are left out; with fewer than two values the interval is ``[None, None]``.
    """
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(data.size)
    if n == 0:
        return {"mean": None, "ci": [None, None], "n": 0}
    mean = float(data.mean())
    if n < 2:
        return {"mean": mean, "ci": [None, None], "n": n}
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * float(data.std(ddof=1)) / math.sqrt(n)
    return {"mean": mean, "ci": [mean - half, mean + half], "n": n}


Matrix = Callable[[str, str], np.ndarray]


def _diagonal(matrix: Matrix, ref: ModelRecord, other: ModelRecord) -> np.ndarray | None:
    block = np.asarray(matrix(ref.name, other.name), dtype=float)
    if block.ndim != 2 or block.shape[0] != block.shape[1]:
        return None
    return np.diagonal(block).copy()


def pair_diagonals(
    references: Sequence[ModelRecord], models: Sequence[ModelRecord], matrix: Matrix
) -> list[np.ndarray] | None:
    """Diagonals of reference × model CKA for every pair that are not the same model.

    None when the blocks are not square (another number of layers than the reference).
    """
    out = []
    for ref in references:
        for other in models:
            if ref.key == other.key:
                continue
            diagonal = _diagonal(matrix, ref, other)
            if diagonal is None:
                return None
            out.append(diagonal)
    return out


Interval = Callable[[str, str], "tuple[np.ndarray, np.ndarray] | None"]


def pair_table(
    references: Sequence[ModelRecord],
    models: Sequence[ModelRecord],
    matrix: Matrix,
    interval: Interval | None = None,
) -> tuple[np.ndarray | None, float | None]:
    """(table, input se): mean diagonal CKA per (reference, model) pair, NaN for a model itself.

    The input se is the mean over pairs of the mean over layers of each diagonal cell's
    bootstrap standard error, (high − low)/(2 · 1.96); None without intervals for every cell.
    The table is None when the blocks are not square.
    """
    table = np.full((len(references), len(models)), np.nan)
    ses: list[float] = []
    for i, ref in enumerate(references):
        for j, other in enumerate(models):
            if ref.key == other.key:
                continue
            diagonal = _diagonal(matrix, ref, other)
            if diagonal is None:
                return None, None
            with np.errstate(all="ignore"):
                table[i, j] = float(np.nanmean(diagonal)) if np.isfinite(diagonal).any() else np.nan
            bounds = None if interval is None else interval(ref.name, other.name)
            if bounds is not None:
                width = np.diagonal(bounds[1]) - np.diagonal(bounds[0])
                if width.size and np.isfinite(width).all():
                    ses.append(float(width.mean()) / (2.0 * Z975))
    pairs = int(np.isfinite(table).sum())
    input_se = float(np.mean(ses)) if pairs and len(ses) == pairs else None
    return table, input_se


Terms = Callable[[str, str], "np.ndarray | None"]


def table_image_terms(
    references: Sequence[ModelRecord],
    models: Sequence[ModelRecord],
    table: np.ndarray | None,
    terms: Terms | None,
    *,
    upper: bool = False,
) -> np.ndarray | None:
    """Each image's projection of the table's mean: the mean of its pairs' image terms.

    The pairs are the table's finite cells (only i < k with ``upper``: the seed-to-seed
    baseline, whose mean is over unordered pairs); None without a table, without ``terms``
    (the atlas's :meth:`~analysis.Atlas.image_terms`) or when any pair has none.
    """
    if table is None or terms is None:
        return None
    found = []
    for i, ref in enumerate(references):
        for j, other in enumerate(models):
            if not np.isfinite(table[i, j]) or (upper and j <= i):
                continue
            got = terms(ref.name, other.name)
            if got is None:
                return None
            found.append(np.asarray(got, dtype=float))
    if not found or len({f.shape for f in found}) != 1:
        return None
    mean: np.ndarray = np.mean(found, axis=0)
    return mean


def seed_to_seed_diagonals(references: Sequence[ModelRecord], matrix: Matrix) -> list[np.ndarray]:
    """Diagonals of reference × reference CKA over unordered pairs of different models."""
    out = []
    for i, ref in enumerate(references):
        for other in references[i + 1 :]:
            if ref.key != other.key:
                diagonal = _diagonal(matrix, ref, other)
                if diagonal is not None:
                    out.append(diagonal)
    return out


def diagonal_summary(diagonals: Sequence[np.ndarray] | None) -> dict[str, Any]:
    """``{"mean", "ci", "n_pairs", "per_layer"}`` of per-pair diagonal means (see the module)."""
    if not diagonals:
        return {"mean": None, "ci": [None, None], "n_pairs": 0, "per_layer": []}
    stacked = np.stack(diagonals)
    with np.errstate(all="ignore"):
        pair_means = [float(np.nanmean(d)) if np.isfinite(d).any() else math.nan for d in stacked]
        per_layer = [
            _finite(float(np.nanmean(col))) if np.isfinite(col).any() else None for col in stacked.T
        ]
    interval = t_interval(pair_means)
    return {
        "mean": interval["mean"],
        "ci": interval["ci"],
        "n_pairs": interval["n"],
        "per_layer": per_layer,
    }


def cell_intervals(
    blocks: Sequence[np.ndarray], level: float = LEVEL
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-cell mean and t-interval over a stack of equal-shape matrices (NaN for n < 2)."""
    stacked = np.stack([np.asarray(b, dtype=float) for b in blocks])
    n = stacked.shape[0]
    mean = stacked.mean(axis=0)
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, nan.copy()
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * stacked.std(axis=0, ddof=1)
    half /= math.sqrt(n)
    return mean, mean - half, mean + half
