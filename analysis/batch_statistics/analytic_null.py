"""The analytic null: every cell's exact null cumulants summed over batches, and kept Grams.

The default null (:mod:`analysis.inference.analytic_null`); in minibatch mode only. Every
layer's centred Grams are kept for the tail check's draws when the whole plan's fit
:data:`analysis.inference.null_draws.KEEP_BYTES` (the same answer in every range of a split
plan). Without the Gram store a batch's centred rows feed it; with the store the engine feeds
it per model from stored invariants (:attr:`AnalyticNullSums.null`), reading back only the Grams
the tail check needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from analysis.batch_statistics.permutation_null import NULL, null_values
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
)
from analysis.inference.analytic_null import AnalyticNull, finish, join_states, tail_warning
from analysis.inference.null_draws import KEEP_BYTES, kept_bytes

__all__ = ["AnalyticNullSums"]


class AnalyticNullSums:
    """:class:`AnalyticNull` of the kept batches, finished into the cells' p-values."""

    key: ClassVar[str] = "analytic"
    needs: ClassVar[Needs] = "rows"
    outputs: ClassVar[tuple[Output, ...]] = NULL
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, setup: Setup) -> None:
        o = setup.options
        planned = kept_bytes(setup.layers, setup.planned, o.batch_size, o.estimator)
        keep = KEEP_BYTES if planned <= KEEP_BYTES else None
        self.null = AnalyticNull(setup.layers, o.estimator, setup.dtype, keep)

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return options.null == "analytic" and options.mode == "minibatch"

    @classmethod
    def start(cls, setup: Setup) -> AnalyticNullSums:
        return cls(setup)

    def update(self, batch: Batch) -> None:
        assert batch.rows is not None
        b = batch.size
        centred, row_sums = batch.rows
        self.null.add(centred.view(-1, b, b), batch=batch.index, row_sums=row_sums)

    def state(self) -> State:
        return self.null.state()

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return join_states(states)

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        config = done.config
        null, tail = finish(
            state, done.hsic, config["estimator"], config["seed"], batches, tick=tick
        )
        done.values |= null_values(null)

        def diagnose(atlas: AtlasView) -> dict[str, Any]:
            out: dict[str, Any] = {"null": tail}
            if tail["without_draws"]:
                out["warnings"] = [*atlas.warnings, tail_warning(tail)]
            return out

        return diagnose
