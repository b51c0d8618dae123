"""A comparison before it runs: its members and their layers, its batches or shards, the seed
ceiling's siblings and the weight of each phase.

The plan is data, made before any forward pass by :func:`plan_comparison` from what is known of
the members without their networks (their resolved layers, a stable key, and what makes seed
siblings); :mod:`analysis.comparison.run` executes it. The library plans from the networks it is
given (:func:`members_of`), the service from its store's rows; both then run the same steps.

Progress counts every phase in one unit, a network run over the batch plan (its "weight"):

* ``run``: the compared models, once each;
* ``random_init``: two untrained twins of every model per draw (:data:`TWINS_PER_MODEL`);
* ``seed_ceiling``: the ceiling's stand-ins (the networks it chose, :func:`stand_ins`);
* ``measures``: the whole-sample measures beside CKA, counted as one more pass of the models
  (their factorisations and pairs cost about that on the demo's layers; within the phase,
  progress moves by layer pairs).

``on_batch(done, total)`` is then called with batches so weighted (``total`` 0 for an iterable
of unknown length), and ``done == total`` only once the result is complete: the last batch of
the last phase is counted when everything after it (the combine, the null's tail draws) is
done too, so a finish that takes a while never reads as done.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, Protocol

from torch import nn

from analysis.comparison.baselines import TWINS_PER_MODEL
from analysis.comparison.seed_ceiling import (
    CeilingPlan,
    Identity,
    needed_siblings,
    plan_ceiling,
    stand_ins,
)
from analysis.errors import AnalysisError, Cancelled
from analysis.layers import resolve_layers
from analysis.options import CompareOptions
from analysis.shards.shard import shard_ranges

__all__ = [
    "PHASES",
    "ComparisonPlan",
    "Member",
    "Networks",
    "OnBatch",
    "Phase",
    "Progress",
    "members_of",
    "plan_comparison",
]

# ``on_batch(done, total)``: progress; returning False stops the comparison (Cancelled).
OnBatch = Callable[[int, int], bool | None]
Phase = Literal["run", "random_init", "seed_ceiling", "measures"]
PHASES: tuple[Phase, ...] = ("run", "random_init", "seed_ceiling", "measures")


class Networks(Protocol):
    """Where a comparison's networks come from: its members and the seed ceiling's siblings.

    ``where`` says where siblings are looked for, in the reason a block has none ("among the
    models", "in the store")."""

    where: str

    def candidates(self, archs: Collection[str]) -> Sequence[Identity]:
        """Every network of one of ``archs`` that may be a member's seed sibling."""
        ...

    def lease(self, keys: Sequence[str]) -> AbstractContextManager[Mapping[str, nn.Module]]:
        """The networks of ``keys`` (members' and siblings' keys), held while in use."""
        ...


@dataclass(frozen=True)
class Member:
    """One compared model as the plan knows it, before its network is loaded.

    ``key``: its stable identity (a checkpoint's sha256, else its label), under which its
    network is leased (:class:`analysis.comparison.run.Networks`); ``cache_key``: its key in
    the Gram store (None: its Grams are not stored); ``identity``: what makes its seed siblings
    (None: it has none).
    """

    label: str
    layers: tuple[str, ...]
    key: str
    cache_key: str | None = None
    identity: Identity | None = None


def members_of(
    models: Mapping[str, nn.Module],
    options: CompareOptions,
    model_keys: Mapping[str, str] | None = None,
) -> list[Member]:
    """The members of a comparison of ``models`` (a bad layer selection fails here, before any
    forward pass); ``model_keys``: a stable key per model, which also turns the Gram store on
    for it."""
    keys = dict(model_keys or {})
    layers = options.layers
    out = []
    for label, net in models.items():
        chosen = layers.get(label) if isinstance(layers, Mapping) else layers
        resolved = resolve_layers(net, chosen, model_name=f"model {label!r}")
        key = keys.get(label, label)
        out.append(
            Member(
                label=label,
                layers=tuple(resolved),
                key=key,
                cache_key=keys.get(label),
                identity=Identity.of_model(label, net, key),
            )
        )
    return out


@dataclass(frozen=True)
class ComparisonPlan:
    """What a comparison will do (see the module docstring): run ``options`` over ``members``
    on ``batches`` batches (None: an iterable of unknown length), in ``shards`` (ranges of
    batches run apart; empty: one piece), then the baselines the options ask for, the seed
    ceiling's stand-ins being ``ceiling``'s choice."""

    members: tuple[Member, ...]
    options: CompareOptions
    batches: int | None
    shards: tuple[range, ...] = ()
    ceiling: CeilingPlan | None = None
    weights: Mapping[Phase, int] = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        return [m.label for m in self.members]

    @property
    def layers(self) -> dict[str, list[str]]:
        """Each member's resolved layers, in the comparison's order."""
        return {m.label: list(m.layers) for m in self.members}

    @property
    def sibling_keys(self) -> list[str]:
        """The keys of the seed ceiling's stand-ins that are not members (networks to load)."""
        if self.ceiling is None:
            return []
        return needed_siblings(self.ceiling.chosen, {m.label: m.identity for m in self.members})

    def progress(self, on_batch: OnBatch | None) -> Progress:
        """The comparison's progress over its phases, reported to ``on_batch``."""
        return Progress(on_batch, self.weights, self.batches or 0)


def plan_comparison(
    members: Sequence[Member],
    options: CompareOptions,
    *,
    batches: int | None,
    networks: Networks | None = None,
    shards: int = 1,
    shard_batches: int | None = None,
    max_shards: int | None = None,
) -> ComparisonPlan:
    """The plan of comparing ``members`` with ``options`` over a batch plan of ``batches``.

    ``networks``: where the seed ceiling looks for the members' siblings (asked only when the
    options want the ceiling; without it there are none); ``shards``: ranges to split the
    batches into, at least ``batches / shard_batches`` of them when that is given, at most
    ``max_shards`` (minibatch mode only; one range is no split).
    """
    if not members:
        raise AnalysisError("no models to compare")
    labels = [m.label for m in members]
    if len(set(labels)) != len(labels):
        raise AnalysisError(f"the models' names are not unique: {labels}")
    ceiling = None
    if "seed_ceiling" in options.baselines:
        idents = {m.label: m.identity for m in members}
        layers = {m.label: list(m.layers) for m in members}
        archs = {i.arch for i in idents.values() if i is not None}
        candidates = networks.candidates(archs) if networks is not None and archs else ()
        where = networks.where if networks is not None else "given"
        ceiling = plan_ceiling(idents, layers, candidates, where)
    ranges: list[range] = []
    if options.mode == "minibatch" and batches:
        wanted = shards
        if shard_batches and batches > shard_batches:
            wanted = max(wanted, math.ceil(batches / shard_batches))
        if max_shards is not None:
            wanted = min(wanted, max_shards)
        ranges = shard_ranges(batches, wanted)
    weights: dict[Phase, int] = {"run": len(members)}
    if "random_init" in options.baselines:
        weights["random_init"] = TWINS_PER_MODEL * len(members) * options.random_init_draws
    if ceiling is not None:
        weights["seed_ceiling"] = stand_ins(ceiling.chosen)
    if options.whole_sample:
        weights["measures"] = len(members)
    return ComparisonPlan(
        members=tuple(members),
        options=options,
        batches=batches,
        shards=tuple(ranges) if len(ranges) > 1 else (),
        ceiling=ceiling,
        weights=weights,
    )


@dataclass
class Progress:
    """``on_batch(done, total)`` over the phases of a plan (see the module docstring): phase
    ``k``'s batches weigh ``weights[k]``, and the last unit is reported at the very end."""

    on_batch: OnBatch | None
    weights: Mapping[Phase, int]
    batches: int

    @property
    def total(self) -> int:
        """Every phase's weighted batches (0: the length is unknown)."""
        return sum(self.weights.values()) * self.batches

    def _before(self, phase: Phase) -> int:
        return sum(w for p, w in self.weights.items() if PHASES.index(p) < PHASES.index(phase))

    def share(self, phase: Phase) -> float:
        """The part of the whole that the phases before ``phase`` make."""
        whole = sum(self.weights.values())
        return self._before(phase) / whole if whole else 0.0

    def phase(self, phase: Phase) -> OnBatch | None:
        """``phase``'s callback: its own (done, total), as work of the whole comparison."""
        if self.on_batch is None:
            return None
        report, before = self.on_batch, self._before(phase)
        weight, batches, whole = self.weights.get(phase, 0), self.batches, self.total

        def on_batch(done: int, total: int) -> bool | None:
            if not whole or not total:  # an iterable of unknown length: count as they come
                return report(done, 0)
            reached = (before * total + weight * done) * batches // total
            return report(min(reached, whole - 1), whole)  # the last unit: done()

        return on_batch

    def part(self, phase: Phase, k: int, parts: int) -> OnBatch | None:
        """The callback of part ``k`` of ``parts`` equal parts of ``phase`` (its draws)."""
        report = self.phase(phase)
        if report is None:
            return None

        def on_batch(done: int, total: int) -> bool | None:
            return report(k * total + done, parts * total) if total else report(done, 0)

        return on_batch

    def ticker(self, phase: Phase) -> Callable[[int, int], None]:
        """``phase``'s progress for steps that are not batches (a finish's pairs of layers, the
        null's tail draws): (done, total) of them, raising :class:`analysis.Cancelled` when the
        caller stops. Several finishes tick in turn; the phase's progress never goes back."""
        report = self.phase(phase)
        reached = [0.0]

        def tick(done: int, total: int) -> None:
            if report is None:
                return
            share = done / total if total else 0.0
            if share < reached[0]:  # a later step of the phase, not yet past an earlier one
                done, total, share = round(reached[0] * 1_000_000), 1_000_000, reached[0]
            reached[0] = share
            if report(done, total) is False:
                raise Cancelled(f"cancelled in the {phase} phase")

        return tick

    def done(self) -> None:
        """The last unit: the result is complete."""
        if self.on_batch is not None and self.total:
            self.on_batch(self.total, self.total)
