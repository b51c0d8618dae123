"""Every requested whole-sample measure between every pair of layers of an atlas.

Each layer is factorised once (:func:`analysis.measures.factor.factorise`) and, for mutual k-NN,
given its neighbours once; each pair then costs a small product and SVD, except the R² measures,
which come for every pair at once from the layers' projectors where those fit
(:mod:`analysis.measures.projected`). Every measure is symmetric, so the upper triangle is
computed and mirrored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from analysis.measures.cca import cca_family, degenerate
from analysis.measures.factor import factorise
from analysis.measures.linreg import linreg
from analysis.measures.mutual_knn import mutual_knn, neighbours
from analysis.measures.procrustes import procrustes
from analysis.measures.projected import PROJECTED, projected_measures, use_projectors

__all__ = ["CCA_FAMILY", "MeasureMatrices", "measure_matrices"]

CCA_FAMILY = frozenset({"cca", "cca_mean", "svcca", "pwcca"})


@dataclass
class MeasureMatrices:
    """Per measure, its (L, L) matrix over the layers; ``degenerate`` (L, L) marks the cells
    where the CCA family meets its d ≥ n regime (None without it); ``ranks``: each layer's
    centred rank (None without a factorisation)."""

    values: dict[str, np.ndarray]
    degenerate: np.ndarray | None
    ranks: list[int] | None


def measure_matrices(
    features: Sequence[torch.Tensor],
    measures: Sequence[str],
    *,
    k: int = 10,
    tick: Callable[[int, int], None] | None = None,
) -> MeasureMatrices:
    """The ``measures`` (names other than ``cka``) between every pair of ``features`` (each
    (n, d_i) over the same n samples, in the same order). ``tick(done, total)`` runs after each
    layer's factorisation and each pair of layers (it may raise to stop the work there)."""
    with flushed_denormals():
        return _matrices(features, [m for m in measures if m != "cka"], k, tick or _no_tick)


def _no_tick(done: int, total: int) -> None:
    """Progress that nobody reads."""


@contextmanager
def flushed_denormals() -> Iterator[None]:
    """Subnormal floats read as zero meanwhile (torch's default, off, after): the eigensolver
    on a layer's Gram, whose null space gives it subnormal intermediates, ran 10 to 40 times
    slower with them on the demo's layers (x86 handles subnormals in microcode)."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _matrices(
    features: Sequence[torch.Tensor], wanted: list[str], k: int, tick: Callable[[int, int], None]
) -> MeasureMatrices:
    size = len(features)
    factored = set(wanted) - {"mutual_knn"}
    # the steps: each layer factorised, each given its neighbours, each pair of layers
    per_layer = bool(factored) + ("mutual_knn" in wanted)
    steps, done = per_layer * size + size * (size + 1) // 2, 0

    def step() -> None:
        nonlocal done
        done += 1
        tick(done, steps)

    values = {m: np.full((size, size), np.nan) for m in wanted}
    factors = None
    if factored:
        factors = []
        for f in features:
            factors.append(factorise(f, loadings="pwcca" in factored))
            step()
    knn = None
    if "mutual_knn" in wanted:
        knn = []
        for f in features:
            knn.append(neighbours(f, k))
            step()
    flags = np.zeros((size, size), dtype=bool) if factored & CCA_FAMILY else None
    per_pair = set(factored)
    if factors is not None and use_projectors(len(features[0]), size, factored & PROJECTED):
        values |= projected_measures(factors, factored & PROJECTED)
        per_pair -= PROJECTED
    for i in range(size):
        for j in range(i, size):
            cell: dict[str, float] = {}
            if factors is not None:
                fx, fy = factors[i], factors[j]
                if flags is not None:
                    flags[i, j] = flags[j, i] = degenerate(fx, fy)
                if per_pair & CCA_FAMILY:
                    cell |= cca_family(fx, fy, per_pair & CCA_FAMILY)
                if "linreg" in per_pair:
                    cell["linreg"] = linreg(fx, fy)
                if "procrustes" in per_pair:
                    cell["procrustes"] = procrustes(fx, fy)
            if knn is not None:
                cell["mutual_knn"] = mutual_knn(knn[i], knn[j])
            for name, value in cell.items():
                values[name][i, j] = values[name][j, i] = value
            step()
    ranks = None if factors is None else [f.rank for f in factors]
    return MeasureMatrices(values, flags, ranks)
