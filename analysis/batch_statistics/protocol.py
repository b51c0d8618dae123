"""The protocol every per-batch statistic of a run follows, and what it is handed.

A statistic is a class with a ``key`` (its name in a shard's state and file), ``wanted``
(whether a run with these options accumulates it), ``needs`` (what of a batch it reads),
``update`` (one batch), ``state`` (named arrays), ``join`` (the states of ranges of batches, in
batch order, into one) and ``finish`` (the whole plan's state into the atlas). The engine
(:mod:`analysis.engine.streaming`) starts the wanted ones and feeds them; a shard
(:mod:`analysis.shards.shard`) records their states, its file (:mod:`analysis.shards.file`)
writes them as ``<key>.<name>`` arrays, and :func:`analysis.combine` joins and finishes them in
the order of :data:`analysis.batch_statistics.registry.STATISTICS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch

from analysis.atlas import Atlas
from analysis.errors import AnalysisError
from analysis.options import CompareOptions

__all__ = [
    "Batch",
    "BatchStatistic",
    "Diagnose",
    "Needs",
    "Setup",
    "State",
    "Tick",
    "concatenate_states",
    "counted",
    "sum_states",
]

# A statistic's state: named arrays. numpy on the host; a tensor where a run keeps it on its
# device (the sensitivity's features, which can run to gigabytes); the file stores numpy.
State = dict[str, Any]
# What a statistic reads of a batch: only its (L, L) HSIC terms; also every layer's centred
# rows (the Gram store may instead feed it per model: the analytic null); or every model's raw
# Grams and centred rows in every batch, stored or not; or the layers' features.
Needs = Literal["hsic", "rows", "grams", "features"]
# Run after the atlas's diagnostics are made: what a statistic adds to them.
Diagnose = Callable[[Atlas], dict[str, Any]]
# A long finish's progress, (done, total) of its steps; it raises analysis.Cancelled when the
# comparison is stopped, so a finish that calls it between steps can be stopped there.
Tick = Callable[[int, int], None]


@dataclass(frozen=True)
class Setup:
    """What a statistic starts from: the run's options and its shape."""

    options: CompareOptions
    sizes: list[int]  # selected layers per model, in model order
    device: torch.device
    dtype: torch.dtype  # the Grams' precision
    planned: int  # batches in the whole plan (0 when unknown)

    @property
    def layers(self) -> int:
        """Layers over all models (L)."""
        return sum(self.sizes)


@dataclass(frozen=True)
class Batch:
    """One kept batch of the plan, as far as the statistics that read it need it."""

    index: int  # global index in the plan
    size: int
    hsic: np.ndarray  # (L, L) float64, the batch's HSIC terms
    grams: torch.Tensor | None = None  # (L, b, b) raw Grams, for ``needs`` "grams"
    rows: tuple[torch.Tensor, torch.Tensor] | None = None  # their centred rows


class BatchStatistic(Protocol):
    """What a run accumulates per batch beside the HSIC sums; see the module docstring."""

    key: ClassVar[str]
    needs: ClassVar[Needs]

    @classmethod
    def wanted(cls, options: CompareOptions) -> bool:
        """Whether a run with ``options`` accumulates this statistic."""
        ...

    @classmethod
    def start(cls, setup: Setup) -> BatchStatistic:
        """An empty accumulator for one run."""
        ...

    def update(self, batch: Batch) -> None:
        """Add one kept batch."""
        ...

    def state(self) -> State:
        """The accumulated state as named arrays (a range of batches' share of the whole)."""
        ...

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        """The state of the batches of all ``states``, given in batch order."""
        ...

    @classmethod
    def finish(cls, atlas: Atlas, state: State, batches: int, tick: Tick) -> Diagnose | None:
        """Write the whole plan's ``state`` into ``atlas`` (its models, layers, HSIC, ``n`` and
        ``config`` are set; ``batches``: how many the plan kept); what it adds to the
        diagnostics once they are made, if anything. A finish that takes long calls ``tick``
        between its steps (progress; it raises when the comparison is stopped)."""
        ...


def sum_states(states: Sequence[State], what: str) -> State:
    """States that add array by array (float64 sums; counts become float64)."""
    keys = list(states[0])
    if any(list(s) != keys for s in states[1:]):
        raise AnalysisError(f"the shards' {what} have different arrays")
    out: State = {}
    for k in keys:
        total = np.array(states[0][k], dtype=np.float64, copy=True)
        for s in states[1:]:
            total += np.asarray(s[k])
        out[k] = total
    return out


def concatenate_states(states: Sequence[State]) -> State:
    """States that join end to end in batch order (per-batch terms, features)."""
    return {k: np.concatenate([np.asarray(s[k]) for s in states]) for k in states[0]}


def counted(state: Mapping[str, Any], key: str = "batches") -> int:
    """A count kept in a state (0-d), as an int."""
    return int(np.asarray(state[key]))
