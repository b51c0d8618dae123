"""Each layer's spectrum over batches: participation ratio and top-component share, summed.

Kept with permutations or the sensitivity (:mod:`analysis.estimators.spectrum`); finished into
``layer_effective_dim`` and ``layer_top_share`` (with the sensitivity, the whole sample's share
replaces the batches' average: :mod:`analysis.batch_statistics.sensitivity`), and the
calibration warnings (:mod:`analysis.batch_statistics.flags`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from analysis.batch_statistics.flags import calibration_flags
from analysis.batch_statistics.protocol import (
    AtlasView,
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
    counted,
    sum_states,
)
from analysis.estimators.spectrum import SpectrumAccumulator

__all__ = ["TOP_SHARE", "LayerSpectra"]

# Per layer, the share of its variance in its top component (the sensitivity's whole-sample
# share replaces the batches' average).
TOP_SHARE = Output("top_pc_share", "layers")


class LayerSpectra:
    """:class:`SpectrumAccumulator` over the kept batches."""

    key: ClassVar[str] = "spectra"
    needs: ClassVar[Needs] = "grams"
    outputs: ClassVar[tuple[Output, ...]] = (Output("effective_dim", "layers"), TOP_SHARE)
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, setup: Setup) -> None:
        o = setup.options
        # with sensitivity the top share is the whole sample's (analysis.estimators.spectrum)
        self.spectra = SpectrumAccumulator(setup.layers, o.estimator, top=not o.sensitivity)

    @classmethod
    def wanted(cls, options: Options) -> bool:
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
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        count = max(counted(state), 1)
        done.values["effective_dim"] = state["pr"] / count
        if not done.config["sensitivity"]:
            done.values["top_pc_share"] = state["share"] / count
        n = done.n

        def flags(atlas: AtlasView) -> dict[str, object]:
            warnings, found = calibration_flags(atlas, n / max(batches, 1))
            return {"warnings": warnings, "flags": found}

        return flags
