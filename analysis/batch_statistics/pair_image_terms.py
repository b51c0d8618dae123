"""Per-image projections of each model pair's mean diagonal CKA, for paired differences.

With ``interval="images"`` a minibatch run also keeps, for every pair of models with equal
layer counts, each image's first-order projection of the mean of the pair's diagonal cells
(:mod:`analysis.inference.paired_images`): two such pairs' values over the same images differ
with the image variance ``Σ_a (φ_a − φ'_a)²``, not the sum of their variances. A study's
differences read them (:mod:`analysis.studies.differences`). The per-batch terms join end to
end; the output is (M, M, N), written per pair (:meth:`analysis.Atlas.image_terms`). An atlas
whose pairs × images would exceed :data:`MAX_TERMS`, or whose diagonal cells × images (the
state, 8 bytes each) would exceed :data:`MAX_CELL_TERMS`, keeps none (its differences fall
back to the sum of the two sides' variances, and say so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from analysis.batch_statistics.protocol import (
    Batch,
    Diagnose,
    Finishing,
    Needs,
    Options,
    Output,
    Setup,
    State,
    Switch,
    Tick,
    concatenate_states,
)
from analysis.inference.paired_images import DiagonalCells, diagonal_terms, pair_projections

__all__ = ["MAX_CELL_TERMS", "MAX_TERMS", "PairImageTerms", "decode_pairs", "encode_pairs"]

# The most (model pairs × images) values an atlas keeps: 2 million, about 30 MB of JSON.
MAX_TERMS = 2_000_000
# The most (diagonal cells × images) terms a run holds until its finish: 128 MB of float64.
MAX_CELL_TERMS = 16_000_000


class PairImageTerms:
    """Each kept batch's per-image terms of the diagonal cells, finished into ``image_terms``."""

    key: ClassVar[str] = "pair_images"
    needs: ClassVar[Needs] = "grams"
    outputs: ClassVar[tuple[Output, ...]] = (Output("image_terms", "images"),)
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, setup: Setup) -> None:
        self.cells = DiagonalCells.every_pair(setup.sizes)
        images = setup.planned * setup.options.batch_size
        self.kept = (
            bool(self.cells.pairs)
            and len(self.cells.pairs) * images <= MAX_TERMS
            and len(self.cells.x) * images <= MAX_CELL_TERMS
        )
        self.estimator = setup.options.estimator
        self.layers = setup.layers
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return options.mode == "minibatch" and options.interval == "images"

    @classmethod
    def start(cls, setup: Setup) -> PairImageTerms:
        return cls(setup)

    def update(self, batch: Batch) -> None:
        if self.kept:
            assert batch.rows is not None
            cells = self.cells
            self.parts.append(diagonal_terms(batch.rows, self.estimator, cells.x, cells.y))

    def state(self) -> State:
        k = len(self.cells.x) if self.kept else 0
        cells = [p[0] for p in self.parts] or [np.zeros((0, k))]
        own = [p[1] for p in self.parts] or [np.zeros((0, self.layers if self.kept else 0))]
        return {"cells": np.concatenate(cells), "self": np.concatenate(own)}

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return concatenate_states(states)

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        psi_cells, psi_self = np.asarray(state["cells"]), np.asarray(state["self"])
        cells = DiagonalCells.every_pair(done.sizes)
        if len(psi_self) and psi_cells.shape[1] == len(cells.x) and cells.pairs:
            means = pair_projections(done.hsic, cells, psi_cells, psi_self)
            full = np.full((cells.models, cells.models, len(psi_self)), np.nan)
            for k, (i, j) in enumerate(cells.pairs):
                full[i, j] = full[j, i] = means[:, k]
            done.values["image_terms"] = full
        return None


def _short(v: float) -> float | None:
    """A term as JSON: 7 significant digits (a variance needs no more), None where not finite."""
    return float(f"{v:.7g}") if np.isfinite(v) else None


def encode_pairs(value: np.ndarray) -> list[list[float | None] | None]:
    """(M, M, N) as JSON: one list per model pair a < b, in :meth:`analysis.Atlas.pairs`'s
    order without the pairs of a model with itself; None for a pair without terms."""
    m = value.shape[0]
    out: list[list[float | None] | None] = []
    for i in range(m):
        for j in range(i + 1, m):
            terms = value[i, j]
            out.append([_short(v) for v in terms] if np.isfinite(terms).any() else None)
    return out


def decode_pairs(models: int, rows: Sequence[Sequence[float | None] | None]) -> np.ndarray:
    """:func:`encode_pairs`'s inverse for ``models`` models."""
    n = max((len(r) for r in rows if r is not None), default=0)
    out = np.full((models, models, n), np.nan)
    pairs = ((i, j) for i in range(models) for j in range(i + 1, models))
    for (i, j), row in zip(pairs, rows, strict=True):
        if row is not None:
            out[i, j] = out[j, i] = [np.nan if v is None else v for v in row]
    return out
