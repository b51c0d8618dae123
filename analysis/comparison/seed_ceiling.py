"""The seed ceiling: each cell with a model replaced by a *seed sibling* of it.

A sibling of a model is another checkpoint of the same architecture, the same options but the
seed, and the same training dataset, seeded otherwise (:class:`Identity`). The ceiling of a cell
is the sibling's CKA with the other side of the cell. In a model's block with itself that is the
seed-to-seed agreement, the most two trainings of one architecture agree; between two models it
shows what another seed of one of them gives against the other. Where both models of a pair have
a sibling, the one earlier in the comparison's order is replaced, so the block of (b, a) is the
transpose of that of (a, b). A sibling that is the other side of the block is never taken (for
two seeds of one architecture it would be that model against itself, see
:func:`analysis.comparison.baselines.choose`): the next sibling is (a third seed), and with none the
block is undefined, its reason in ``blocks`` ("no sibling other than the compared model"); so are
the blocks of pairs where neither model has a sibling.

Where the siblings come from is the caller's (:class:`analysis.comparison.run.Networks`):
:func:`analysis.compare` takes them among the models it was given (and its ``siblings``,
candidates that are not compared), the service among every checkpoint in its store. Either way
:func:`plan_seed_ceiling` chooses, when the comparison is planned
(:func:`analysis.comparison.plan.plan_comparison`), and
:func:`seed_ceiling_baseline` runs the chosen stand-ins through the comparison's own options
(with its intervals, so that a verdict can weigh the ceiling's noise too) and stores a full
(L_total, L_total) matrix in the atlas's layer order, with ``blocks`` listing per block (a at or
before b) what stood in for the rows and the columns, or the ``reason`` it is undefined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from analysis.comparison.baselines import (
    Block,
    Candidates,
    OnBatch,
    Pair,
    RunAtlas,
    StandIn,
    choose,
    matrix_json,
    paired_image_var,
    substituted_cka,
)
from analysis.options import CompareOptions

__all__ = [
    "AMONG_THE_MODELS",
    "IN_THE_STORE",
    "SIBLING_PREFIX",
    "CeilingPlan",
    "Identity",
    "find_siblings",
    "needed_siblings",
    "plan_ceiling",
    "plan_seed_ceiling",
    "seed_ceiling_baseline",
    "stand_ins",
    "undefined_blocks",
]

SIBLING_PREFIX = "sibling of "
# Where a sibling was looked for, in the reason a block has none.
IN_THE_STORE = "in the store"
AMONG_THE_MODELS = "among the models"


@dataclass(frozen=True)
class Identity:
    """What makes two checkpoints siblings: everything but the seed, and the seed."""

    key: str  # a stable id of the checkpoint (its sha256)
    name: str
    arch: str
    options: tuple[tuple[str, str], ...]  # the config without its seed, as sorted pairs
    dataset: str | None  # sha256 of the training dataset, None when untrained / unknown
    seed: tuple[str, str]  # (training seed, architecture seed), as text
    model_id: int | None = None

    @classmethod
    def of(
        cls,
        key: str,
        name: str,
        arch: str,
        config: Mapping[str, Any],
        sidecar: Mapping[str, Any],
        model_id: int | None = None,
    ) -> Identity:
        """From a checkpoint's architecture, config and sidecar (the database row's columns)."""
        dataset = sidecar.get("dataset") or {}
        return cls(
            key=key,
            name=name,
            arch=arch,
            options=tuple(sorted((k, repr(v)) for k, v in config.items() if k != "seed")),
            dataset=dataset.get("sha256") if isinstance(dataset, Mapping) else None,
            seed=(repr(sidecar.get("seed")), repr(config.get("seed"))),
            model_id=model_id,
        )

    def is_sibling(self, other: Identity) -> bool:
        """Another checkpoint of the same architecture, options and dataset, seeded otherwise."""
        return (
            other.key != self.key
            and other.arch == self.arch
            and other.options == self.options
            and other.dataset == self.dataset
            and other.seed != self.seed
        )

    @classmethod
    def of_model(cls, label: str, model: nn.Module, key: str | None = None) -> Identity | None:
        """From a network built by :func:`models.create` or loaded by :func:`models.load` (its
        ``atlas_config``, and the checkpoint's training dataset and seed when it was loaded);
        ``key``: its stable id (a checkpoint's sha256), else ``label``. None for a network that
        carries no ``atlas_config`` (it has no siblings)."""
        cfg = getattr(model, "atlas_config", None)
        if not isinstance(cfg, Mapping) or "arch" not in cfg:
            return None
        sidecar = getattr(model, "atlas_checkpoint", None) or {}
        config = cfg.get("config") or {}
        return cls.of(key or label, label, str(cfg["arch"]), config, sidecar)

    def describe(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "name": self.name, "sha256": self.key}


def find_siblings(
    members: Mapping[str, Identity | None], candidates: Sequence[Identity]
) -> dict[str, list[Identity]]:
    """Per member label, its siblings among ``candidates``, in their order (none: absent)."""
    found = {}
    for label, ident in members.items():
        if ident is None:
            continue
        sibs = [c for c in candidates if ident.is_sibling(c)]
        if sibs:
            found[label] = sibs
    return found


def _stand_in(ident: Identity, label: str, layers: Sequence[str]) -> StandIn:
    return StandIn(label, ident.key, tuple(layers), ident.describe(), cache_key=ident.key)


def plan_seed_ceiling(
    members: Mapping[str, Identity | None],
    layers: Mapping[str, Sequence[str]],
    siblings: Mapping[str, Sequence[Identity]],
    where: str = IN_THE_STORE,
) -> dict[Block, Pair | str]:
    """Per block (a at or before b), the sibling pair that stands in, or why there is none.

    A member without an identity (None) has no siblings and is never a stand-in; ``where``
    says where siblings were looked for, in the reason."""
    order = list(members)

    def me(label: str) -> StandIn:
        ident = members[label]
        if ident is None:  # never chosen: a pair needs a sibling on one side
            return StandIn(label, f"unknown:{label}", tuple(layers[label]), {"name": label})
        return _stand_in(ident, label, layers[label])

    def sib(owner: str, s: Identity) -> StandIn:
        return _stand_in(s, f"{SIBLING_PREFIX}{owner}: {s.name} ({s.key[:12]})", layers[owner])

    blocks = {}
    for i, a in enumerate(order):
        for b in order[i:]:
            pairs = [(sib(a, s), me(b)) for s in siblings.get(a, ())]
            pairs += [(me(a), sib(b, s)) for s in siblings.get(b, ())]
            # the block names its models: one reason for every block without a sibling
            blocks[a, b] = Candidates(tuple(pairs), f"no seed sibling {where}", "sibling")
    return choose(blocks)


@dataclass(frozen=True)
class CeilingPlan:
    """The seed ceiling of a comparison before it runs: per block the chosen pair (or why
    none), and per member every sibling found (for the diagnostics)."""

    chosen: dict[Block, Pair | str]
    siblings: dict[str, list[Identity]]


def plan_ceiling(
    members: Mapping[str, Identity | None],
    layers: Mapping[str, Sequence[str]],
    candidates: Sequence[Identity],
    where: str = IN_THE_STORE,
) -> CeilingPlan:
    """:func:`find_siblings` of ``members`` among ``candidates``, then
    :func:`plan_seed_ceiling`."""
    siblings = find_siblings(members, candidates)
    return CeilingPlan(plan_seed_ceiling(members, layers, siblings, where), siblings)


def needed_siblings(
    chosen: Mapping[Block, Pair | str], members: Mapping[str, Identity | None]
) -> list[str]:
    """The keys of the chosen stand-ins that are not members (the checkpoints to load)."""
    own = {ident.key for ident in members.values() if ident is not None}
    keys = {s.identity for pick in chosen.values() if not isinstance(pick, str) for s in pick}
    return sorted(keys - own)


def stand_ins(chosen: Mapping[Block, Pair | str]) -> int:
    """How many networks the chosen stand-ins are (what running the baseline costs)."""
    return len({s.label for pick in chosen.values() if not isinstance(pick, str) for s in pick})


def seed_ceiling_baseline(
    nets: Mapping[str, nn.Module],
    layers: Mapping[str, Sequence[str]],
    chosen: Mapping[Block, Pair | str],
    pool: Mapping[str, nn.Module],
    options: CompareOptions,
    *,
    run: RunAtlas,
    on_batch: OnBatch | None = None,
    projections: np.ndarray | None = None,
) -> dict[str, Any]:
    """The seed ceiling (see the module doc) as a full matrix over ``nets``' layers, with its
    95 % interval (``ci_low``/``ci_high``) when ``options`` ask for intervals.

    ``chosen``: :func:`plan_seed_ceiling`; ``pool``: loaded checkpoints by key (a member may be
    taken from ``nets`` instead); ``run``: how the stand-ins run
    (:data:`analysis.comparison.baselines.RunAtlas`), reporting to ``on_batch``;
    ``projections``: the comparison's (N, L, L) per-image projections of its cells, for the
    paired ``image_var`` (:mod:`analysis.comparison.baselines`).
    """
    sizes = {label: len(layers[label]) for label in nets}

    def resolve(s: StandIn) -> nn.Module:
        return pool[s.identity] if s.identity in pool else nets[s.label]

    found = substituted_cka(
        sizes,
        chosen,
        resolve,
        options,
        run,
        intervals=True,
        projections=projections is not None,
        on_batch=on_batch,
    )
    out = {"cka": matrix_json(found.cka), "blocks": found.blocks}
    if found.ci_low is not None and found.ci_high is not None:
        out |= {"ci_low": matrix_json(found.ci_low), "ci_high": matrix_json(found.ci_high)}
    if projections is not None and found.terms is not None:
        out["image_var"] = paired_image_var(projections, found.terms)
    return out


def undefined_blocks(baselines: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every undefined baseline block: ``{"baseline", "a", "b", "reason"}``."""
    return [
        {"baseline": name, "a": item["a"], "b": item["b"], "reason": item["reason"]}
        for name, stored in baselines.items()
        for item in stored.get("blocks", ())
        if "reason" in item
    ]
