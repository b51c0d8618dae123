"""The batch bootstrap's terms: every kept batch's own HSIC, in batch order.

With ``interval="batches"`` the interval resamples batches (:mod:`analysis.inference.bootstrap`),
so a run keeps each batch's (L, L) terms; ranges join end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from analysis.batch_statistics.image_moments import INTERVAL
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
from analysis.inference.bootstrap import bootstrap_intervals, check_bootstrap_batches

__all__ = ["BootstrapTerms"]


class BootstrapTerms:
    """Each kept batch's HSIC terms, for the percentile bootstrap over batches."""

    key: ClassVar[str] = "per_batch"
    needs: ClassVar[Needs] = "hsic"
    outputs: ClassVar[tuple[Output, ...]] = INTERVAL
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.terms: list[np.ndarray] = []

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return options.mode != "full" and options.interval == "batches"

    @classmethod
    def start(cls, setup: Setup) -> BootstrapTerms:
        return cls(setup.layers)

    def update(self, batch: Batch) -> None:
        self.terms.append(batch.hsic)

    def state(self) -> State:
        width = self.layers
        return {"hsic": np.stack(self.terms) if self.terms else np.zeros((0, width, width))}

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return concatenate_states(states)

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        check_bootstrap_batches(batches)
        if len(state["hsic"]):
            config = done.config
            done.values["ci_low"], done.values["ci_high"] = bootstrap_intervals(
                state["hsic"], config["resamples"], config["seed"]
            )
        return None
