"""The protocol every per-batch statistic of a run follows, and what it is handed.

A statistic is one class, in one module, that declares everything the rest of the library
derives from it:

* ``key``: its name in a shard's state and file (its arrays are ``<key>.<name>`` there);
* ``needs``: what of a batch it reads (:data:`Needs`);
* ``outputs``: the arrays it adds to the :class:`analysis.Atlas` (:class:`Output`: a name, a
  kind, whether each model pair's entry carries its block), from which the atlas's JSON form
  (:meth:`analysis.Atlas.to_dict`, :meth:`~analysis.Atlas.from_dict`) and its accessors are made;
* ``switches``: options of its own, if it needs any (:class:`Switch`), which
  :class:`analysis.CompareOptions` adds to its fields, so the REST schema, the command line and
  the web form offer them;
* ``wanted(options)``: whether a run with these options accumulates it;
* ``start(setup)``, ``update(batch)``, ``state()`` (named arrays), ``join(states)`` (the states
  of ranges of batches, in batch order, into one) and ``finish(state, done, batches, tick)``
  (the whole plan's state into ``done.values``, its outputs by name).

The engine (:mod:`analysis.engine.streaming`) starts the wanted ones and feeds them; a shard
(:mod:`analysis.shards.shard`) records their states, its file (:mod:`analysis.shards.file`)
writes them, and :func:`analysis.combine` joins and finishes them in the order of
:data:`analysis.batch_statistics.registry.STATISTICS`. Statistics sit beneath the options and
the atlas (they read both through the protocols here, :class:`Options` and :class:`AtlasView`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch

from analysis.errors import AnalysisError
from analysis.estimators.hsic import cka_from_hsic
from analysis.inference.image_intervals import sample_terms

__all__ = [
    "AtlasView",
    "Batch",
    "BatchStatistic",
    "Diagnose",
    "Finishing",
    "Needs",
    "Options",
    "Output",
    "OutputKind",
    "Setup",
    "State",
    "Switch",
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
# A long finish's progress, (done, total) of its steps; it raises analysis.Cancelled when the
# comparison is stopped, so a finish that calls it between steps can be stopped there.
Tick = Callable[[int, int], None]
# What an output holds, and so how it is written as JSON (analysis.atlas):
# cells  (L, L) floats, None where not finite;   counts  (L, L) integers, written as floats;
# labels (L, L) strings, None where empty;       flags   (L, L) booleans;
# layers (L,) floats, written per model;
# images (M, M, N) floats, one value per image for each model pair, written per pair (a < b).
OutputKind = Literal["cells", "counts", "labels", "flags", "layers", "images"]


@dataclass(frozen=True)
class Output:
    """One array a statistic adds to the atlas: its ``name`` (the atlas's key for it and its
    JSON key) and ``kind``. ``blocks``: each model pair's entry of the JSON ``matrices`` carries
    its block too; ``always``: written as None when the comparison did not compute it (the
    intervals, which readers expect either way); ``grouped``: a family of arrays under one JSON
    key, one per sub-name (the measures: ``{"measures": {"cca": …}}``, the atlas's values
    ``"measures/cca"``, each pair's block under the sub-name)."""

    name: str
    kind: OutputKind
    blocks: bool = False
    always: bool = False
    grouped: bool = False


@dataclass(frozen=True)
class Switch:
    """An option a statistic brings (a field of :class:`analysis.CompareOptions`): its name, its
    type, default and description; ``minimum``/``maximum`` for numbers. A statistic reads it
    with ``getattr(options, name)``."""

    name: str
    annotation: Any
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None


class Options(Protocol):
    """What statistics read of a comparison's options (:class:`analysis.CompareOptions`)."""

    @property
    def mode(self) -> str: ...
    @property
    def estimator(self) -> str: ...
    @property
    def kernel(self) -> str: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def interval(self) -> str: ...
    @property
    def resamples(self) -> int: ...
    @property
    def permutations(self) -> int: ...
    @property
    def null(self) -> str: ...
    @property
    def sensitivity(self) -> bool: ...
    @property
    def seed(self) -> int: ...
    @property
    def whole_sample(self) -> tuple[str, ...]: ...
    @property
    def baselines(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Setup:
    """What a statistic starts from: the run's options and its shape."""

    options: Options
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
    _terms: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def image_terms(self, estimator: str) -> torch.Tensor:
        """Each image's terms ψ (b, L, L) of the batch's HSIC
        (:func:`analysis.inference.image_intervals.sample_terms`), formed once for all the
        statistics that read them (the image intervals' moments, the verdicts' projections)."""
        if estimator not in self._terms:
            assert self.rows is not None
            self._terms[estimator] = sample_terms(self.rows, estimator)
        return self._terms[estimator]


@dataclass
class Finishing:
    """What a finish reads and where it writes: the whole plan's summed ``hsic`` (L, L), ``n``,
    the atlas's ``config`` (its options as JSON) and ``sizes`` (layers per model), and
    ``values``, the outputs written so far by name (a later finish may read an earlier one's)."""

    hsic: np.ndarray
    n: int
    config: Mapping[str, Any]
    sizes: list[int]
    values: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def cka(self) -> np.ndarray:
        """CKA of every layer pair (NaN where undefined)."""
        return cka_from_hsic(self.hsic)


class AtlasView(Protocol):
    """What a statistic's diagnostics read of the finished atlas (:class:`analysis.Atlas`)."""

    models: list[str]
    layers: dict[str, list[str]]

    @property
    def warnings(self) -> list[str]: ...
    def pairs(self) -> list[tuple[str, str]]: ...
    def matrix(self, a: str, b: str | None = None, measure: str = "cka") -> np.ndarray: ...
    def effective_dim(self, name: str) -> np.ndarray | None: ...
    def without_top_pc(
        self, a: str, b: str | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None: ...


# Run after the atlas's diagnostics are made: what a statistic adds to them.
Diagnose = Callable[[AtlasView], dict[str, Any]]


class BatchStatistic(Protocol):
    """What a run accumulates per batch beside the HSIC sums; see the module docstring."""

    key: ClassVar[str]
    needs: ClassVar[Needs]
    outputs: ClassVar[tuple[Output, ...]]
    switches: ClassVar[tuple[Switch, ...]]

    @classmethod
    def wanted(cls, options: Options) -> bool:
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
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        """Write the whole plan's ``state`` into ``done.values`` (``batches``: how many the
        plan kept); what it adds to the diagnostics once they are made, if anything. A finish
        that takes long calls ``tick`` between its steps (progress; it raises when the
        comparison is stopped)."""
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
