"""Per-image projections of every cell's CKA, kept in memory for a comparison's verdicts.

A comparison with ``baselines`` and ``interval="images"`` keeps, for every pair of layers, each
image's first-order projection φ of the cell's CKA
(:func:`analysis.inference.paired_images.cell_projections`), and so do its baselines' runs of
untrained twins and seed siblings over the same images. A verdict's difference (the cell minus
its twins' mean, or minus its seed ceiling) then has the image variance ``Σ_a (φ_a − φ'_a)²``
(:mod:`analysis.inference.verdicts`), not the sum of the two sides'. The finished (N, L, L)
array lives in the atlas's values under :data:`KEY` only while the comparison runs: it is
declared as no output, so it is never written, and the pipeline drops it once the baselines
have read it. A run whose cells × images would exceed :data:`MAX_CELL_IMAGE_TERMS` keeps none
(its verdicts fall back to the sum of the two sides' variances, and say so).
"""

from __future__ import annotations

import math
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
from analysis.inference.paired_images import cell_projections

__all__ = ["KEY", "MAX_CELL_IMAGE_TERMS", "CellImageTerms"]

# The atlas's value the finished projections are kept under (never written).
KEY = "cell_projections"
# The most (cells × images) terms a run holds, L² per image: 128 MB of float64.
MAX_CELL_IMAGE_TERMS = 16_000_000


class CellImageTerms:
    """Each kept batch's per-image terms ψ of every cell, finished into the projections φ."""

    key: ClassVar[str] = "cell_images"
    needs: ClassVar[Needs] = "grams"
    outputs: ClassVar[tuple[Output, ...]] = ()
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, setup: Setup) -> None:
        images = setup.planned * setup.options.batch_size
        self.layers = setup.layers
        self.kept = 0 < self.layers**2 * images <= MAX_CELL_IMAGE_TERMS
        self.estimator = setup.options.estimator
        self.parts: list[np.ndarray] = []

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return (
            options.mode == "minibatch"
            and options.interval == "images"
            and bool(getattr(options, "baselines", ()))
        )

    @classmethod
    def start(cls, setup: Setup) -> CellImageTerms:
        return cls(setup)

    def update(self, batch: Batch) -> None:
        if self.kept:
            psi = batch.image_terms(self.estimator)
            n = psi.shape[0]
            scaled = psi.double() * math.sqrt(n / (n - 1))  # as the intervals' moments are
            self.parts.append(scaled.cpu().numpy())

    def state(self) -> State:
        k = self.layers if self.kept else 0
        return {"terms": np.concatenate(self.parts or [np.zeros((0, k, k))])}

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return concatenate_states(states)

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        psi = np.asarray(state["terms"])
        if len(psi) and psi.shape[1:] == done.hsic.shape:
            done.values[KEY] = cell_projections(done.hsic, psi)
        return None
