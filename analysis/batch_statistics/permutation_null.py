"""The permutation null drawn: every cell's HSIC under P within-batch permutations, summed.

With ``null="permutation"`` (:mod:`analysis.inference.permutation_null`); batch i draws from
its own random stream, seeded with its global index, so ranges add to the unsplit sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from analysis.atlas import Atlas
from analysis.batch_statistics.protocol import (
    Batch,
    Diagnose,
    Needs,
    Setup,
    State,
    Tick,
    sum_states,
)
from analysis.inference.permutation_null import PermutationNull, summarise_null
from analysis.options import CompareOptions

__all__ = ["DrawnNull"]


class DrawnNull:
    """:class:`PermutationNull` sums (P, L, L), finished into the atlas's null summary."""

    key: ClassVar[str] = "null"
    needs: ClassVar[Needs] = "grams"

    def __init__(self, setup: Setup) -> None:
        o = setup.options
        self.null = PermutationNull(
            setup.sizes, o.permutations, o.seed, o.estimator, setup.device, setup.dtype
        )

    @classmethod
    def wanted(cls, options: CompareOptions) -> bool:
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
    def finish(cls, atlas: Atlas, state: State, batches: int, tick: Tick) -> Diagnose | None:
        sizes = [len(atlas.layers[m]) for m in atlas.models]
        atlas.null, _ = summarise_null(state["sums"], atlas.hsic, sizes)
        return None
