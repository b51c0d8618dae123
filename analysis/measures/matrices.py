"""Every requested whole-sample measure between every pair of layers of an atlas.

Each layer is prepared once for what the wanted measures need (:class:`Need`: factorised by
:func:`analysis.measures.factor.factorise`, given its neighbours by
:func:`analysis.measures.mutual_knn.neighbours`); each pair then costs what its measures'
``pair`` read (:class:`analysis.measures.protocol.Pair` computes the shared products once),
except the measures with a projector route, which come for every pair at once where those fit
(:mod:`analysis.measures.projected`). Every measure is symmetric, so the upper triangle is
computed and mirrored; so are the flags the measures declare.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from analysis.measures.factor import factorise
from analysis.measures.mutual_knn import neighbours
from analysis.measures.projected import projected_measures, use_projectors
from analysis.measures.protocol import Flag, Layer, Measure, Pair
from analysis.measures.registry import measure

__all__ = ["MeasureMatrices", "measure_matrices"]


@dataclass
class MeasureMatrices:
    """Per measure, its (L, L) matrix over the layers; ``flags``: per flag the wanted measures
    declare, its (L, L) booleans (:class:`analysis.measures.protocol.Flag`); ``ranks``: each
    layer's centred rank (None without a factorisation)."""

    values: dict[str, np.ndarray]
    flags: dict[str, np.ndarray]
    ranks: list[int] | None

    @property
    def degenerate(self) -> np.ndarray | None:
        """The cells where the CCA family meets its d ≥ n regime (None without it)."""
        return self.flags.get("cca_degenerate")


def measure_matrices(
    features: Sequence[torch.Tensor],
    measures: Sequence[str],
    *,
    k: int = 10,
    tick: Callable[[int, int], None] | None = None,
) -> MeasureMatrices:
    """The ``measures`` (names other than ``cka``) between every pair of ``features`` (each
    (n, d_i) over the same n samples, in the same order). ``tick(done, total)`` runs after each
    layer's preparation and each pair of layers (it may raise to stop the work there)."""
    wanted = [measure(m) for m in measures if m != "cka"]
    with flushed_denormals():
        return _matrices(features, wanted, k, tick or _no_tick)


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
    features: Sequence[torch.Tensor],
    wanted: list[Measure],
    k: int,
    tick: Callable[[int, int], None],
) -> MeasureMatrices:
    size = len(features)
    needs = {need for m in wanted for need in m.needs}
    # the steps: each layer factorised, each given its neighbours, each pair of layers
    per_layer = ("factor" in needs) + ("neighbours" in needs)
    steps, done = per_layer * size + size * (size + 1) // 2, 0

    def step() -> None:
        nonlocal done
        done += 1
        tick(done, steps)

    values = {m.name: np.full((size, size), np.nan) for m in wanted}
    n = len(features[0]) if size else 0
    factors = None
    if "factor" in needs:
        factors = []
        for f in features:
            factors.append(factorise(f, loadings="loadings" in needs))
            step()
    knn = None
    if "neighbours" in needs:
        knn = []
        for f in features:
            knn.append(neighbours(f, k))
            step()
    layers = [
        Layer(n, k, None if factors is None else factors[i], None if knn is None else knn[i])
        for i in range(size)
    ]
    declared: dict[str, Flag] = {flag.name: flag for m in wanted for flag in m.flags}
    flags = {name: np.zeros((size, size), dtype=bool) for name in declared}
    per_pair = list(wanted)
    projected = [m for m in wanted if m.projected is not None]
    forms = {form for m in projected for form in m.projectors}
    if factors is not None and use_projectors(n, size, len(forms)):
        formulas = [(m.name, m.projected) for m in projected if m.projected is not None]
        values |= projected_measures(factors, formulas)
        per_pair = [m for m in wanted if m.projected is None]
    for i in range(size):
        for j in range(i, size):
            pair = Pair(layers[i], layers[j])
            for name, flag in declared.items():
                flags[name][i, j] = flags[name][j, i] = flag.raised(layers[i], layers[j])
            for m in per_pair:
                values[m.name][i, j] = values[m.name][j, i] = m.pair(pair)
            step()
    ranks = None if factors is None else [f.rank for f in factors]
    return MeasureMatrices(values, flags, ranks)
