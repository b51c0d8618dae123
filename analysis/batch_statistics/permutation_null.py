"""The permutation null drawn: every cell's HSIC under P within-batch permutations, summed.

With ``null="permutation"`` (:mod:`analysis.inference.permutation_null`); batch i draws from
its own random stream, seeded with its global index, so ranges add to the unsplit sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

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
    sum_states,
)
from analysis.inference.permutation_null import NullSummary, PermutationNull, summarise_null

__all__ = ["NULL", "DrawnNull", "null_values"]

# A cell's p-value and its null's mean and 95 % quantile, the permutations behind the p and
# what it rests on (shared with the analytic null: either gives the same arrays).
NULL = (
    Output("p_value", "cells", blocks=True),
    Output("null_mean", "cells", blocks=True),
    Output("null_q95", "cells", blocks=True),
    Output("p_draws", "counts", blocks=True),
    Output("p_method", "labels", blocks=True),
)


def null_values(null: NullSummary) -> dict[str, Any]:
    """A null summary as the atlas's values (:data:`NULL`; ``p_draws`` and ``p_method`` when
    the null gives them)."""
    values = {"p_value": null.p_value, "null_mean": null.null_mean, "null_q95": null.null_q95}
    if null.p_draws is not None:
        values["p_draws"] = null.p_draws
    if null.p_method is not None:
        values["p_method"] = null.p_method
    return values


class DrawnNull:
    """:class:`PermutationNull` sums (P, L, L), finished into the atlas's null summary."""

    key: ClassVar[str] = "null"
    needs: ClassVar[Needs] = "grams"
    outputs: ClassVar[tuple[Output, ...]] = NULL
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, setup: Setup) -> None:
        o = setup.options
        self.null = PermutationNull(
            setup.sizes, o.permutations, o.seed, o.estimator, setup.device, setup.dtype
        )

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return options.null == "permutation"

    @classmethod
    def start(cls, setup: Setup) -> DrawnNull:
        return cls(setup)

    def update(self, batch: Batch) -> None:
        assert batch.rows is not None
        self.null.add(batch.rows, batch=batch.index)

    def state(self) -> State:
        return {"sums": self.null.sums.cpu().numpy()}

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return sum_states(states, "permutation nulls")

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        null, _ = summarise_null(state["sums"], done.hsic, done.sizes)
        done.values |= null_values(null)
        return None
