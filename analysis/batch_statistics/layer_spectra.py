"""Each layer's spectrum over batches: participation ratio and top-component share, summed.

Kept with permutations or the sensitivity (:mod:`analysis.estimators.spectrum`); finished into
``layer_effective_dim`` and ``layer_top_share`` (with the sensitivity, the whole sample's share
replaces the batches' average: :mod:`analysis.batch_statistics.sensitivity`), and the
calibration warnings (:mod:`analysis.batch_statistics.flags`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from analysis.atlas import Atlas
from analysis.batch_statistics.flags import calibration_flags
from analysis.batch_statistics.protocol import (
    Batch,
    Diagnose,
    Needs,
    Setup,
    State,
    Tick,
    counted,
    sum_states,
)
from analysis.estimators.spectrum import SpectrumAccumulator
from analysis.options import CompareOptions

__all__ = ["LayerSpectra"]


class LayerSpectra:
    """:class:`SpectrumAccumulator` over the kept batches."""

    key: ClassVar[str] = "spectra"
    needs: ClassVar[Needs] = "grams"

    def __init__(self, setup: Setup) -> None:
        o = setup.options
        # with sensitivity the top share is the whole sample's (analysis.estimators.spectrum)
        self.spectra = SpectrumAccumulator(setup.layers, o.estimator, top=not o.sensitivity)

    @classmethod
    def wanted(cls, options: CompareOptions) -> bool:
        return bool(options.permutations or options.sensitivity)

    @classmethod
    def start(cls, setup: Setup) -> LayerSpectra:
        return cls(setup)

    def update(self, batch: Batch) -> None:
        assert batch.grams is not None and batch.rows is not None
        self.spectra.add(batch.grams, batch.rows)

    def state(self) -> State:
        return self.spectra.state()

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return sum_states(states, "spectra")

    @classmethod
    def finish(cls, atlas: Atlas, state: State, batches: int, tick: Tick) -> Diagnose | None:
        count = max(counted(state), 1)
        atlas.layer_effective_dim = state["pr"] / count
        if not atlas.config["sensitivity"]:
            atlas.layer_top_share = state["share"] / count
        n = atlas.n

        def flags(done: Atlas) -> dict[str, object]:
            warnings, found = calibration_flags(done, n / max(batches, 1))
            return {"warnings": warnings, "flags": found}

        return flags
