"""Baselines of a comparison: what a CKA value would be without training, or with another seed.

Every baseline chooses its stand-ins under one rule, :func:`analysis.baselines.choose`: the two
networks of a baseline block are never one network, so no baseline compares a model with itself.

``random_init``
    Every model replaced by untrained twins of the same architecture and options, each model
    and each of ``random_init_draws`` draws with its own seed, run through the same pipeline
    (layers, kernel, estimator, batch plan, features):
    :func:`analysis.baselines.random_init_baseline`, whose module says how the seeds are
    derived. A trained cell close to its twins' mean owes little to training: architecture and
    input alone give it.
``seed_ceiling``
    For a model with a *sibling* (same architecture, same options but the seed, same training
    dataset, another seed), the sibling's CKA with the other side of the cell. In a model's
    block with itself that is the seed-to-seed agreement, the most two trainings of one
    architecture agree; between two models it shows what another seed of one of them gives
    against the other. Where both models of a pair have a sibling, the one earlier in the
    comparison's order is replaced, so the block of (b, a) is the transpose of that of (a, b).
    A sibling that is the other side of the block is never taken (for two seeds of one
    architecture it would be that model against itself): the next sibling in the store is (a
    third seed), and with none the block is undefined, its reason in ``blocks`` and in the
    diagnostics ("no sibling other than the compared model"); so are the blocks of pairs where
    neither model has a sibling.

Both are stored as full (L_total, L_total) matrices in the layer order of the atlas, under
``result["baselines"]``, so every reader (matrix endpoint, page, export) slices them the same
way as the CKA itself; ``blocks`` lists per block (a at or before b) what stood in for the rows
and the columns, or the ``reason`` it is undefined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

import analysis
from analysis.baselines import (
    Block,
    Candidates,
    Pair,
    StandIn,
    choose,
    matrix_json,
    substituted_cka,
)

__all__ = [
    "SIBLING_PREFIX",
    "Identity",
    "find_siblings",
    "needed_siblings",
    "plan_seed_ceiling",
    "seed_ceiling_baseline",
    "undefined_blocks",
]

SIBLING_PREFIX = "sibling of "


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

    def describe(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "name": self.name, "sha256": self.key}


def find_siblings(
    members: Mapping[str, Identity], candidates: Sequence[Identity]
) -> dict[str, list[Identity]]:
    """Per member label, its siblings among ``candidates``, in their order (none: absent)."""
    found = {}
    for label, ident in members.items():
        sibs = [c for c in candidates if ident.is_sibling(c)]
        if sibs:
            found[label] = sibs
    return found


def _stand_in(ident: Identity, label: str, layers: Sequence[str]) -> StandIn:
    return StandIn(label, ident.key, tuple(layers), ident.describe(), cache_key=ident.key)


def plan_seed_ceiling(
    members: Mapping[str, Identity],
    layers: Mapping[str, Sequence[str]],
    siblings: Mapping[str, Sequence[Identity]],
) -> dict[Block, Pair | str]:
    """Per block (a at or before b), the sibling pair that stands in, or why there is none."""
    order = list(members)

    def me(label: str) -> StandIn:
        return _stand_in(members[label], label, layers[label])

    def sib(owner: str, s: Identity) -> StandIn:
        return _stand_in(s, f"{SIBLING_PREFIX}{owner}: {s.name} ({s.key[:12]})", layers[owner])

    blocks = {}
    for i, a in enumerate(order):
        for b in order[i:]:
            pairs = [(sib(a, s), me(b)) for s in siblings.get(a, ())]
            pairs += [(me(a), sib(b, s)) for s in siblings.get(b, ())]
            who = a if a == b else f"{a} or {b}"
            blocks[a, b] = Candidates(
                tuple(pairs), f"no seed sibling of {who} in the store", "sibling"
            )
    return choose(blocks)


def needed_siblings(
    chosen: Mapping[Block, Pair | str], members: Mapping[str, Identity]
) -> list[str]:
    """The keys of the chosen stand-ins that are not members (the checkpoints to load)."""
    own = {ident.key for ident in members.values()}
    keys = {s.identity for pick in chosen.values() if not isinstance(pick, str) for s in pick}
    return sorted(keys - own)


def seed_ceiling_baseline(
    nets: Mapping[str, nn.Module],
    layers: Mapping[str, Sequence[str]],
    chosen: Mapping[Block, Pair | str],
    pool: Mapping[str, nn.Module],
    data: Any,
    options: analysis.CompareOptions | None = None,
    *,
    device: Any = None,
    progress: bool = False,
    gram_cache: analysis.GramCache | None = None,
    **shortcuts: Any,
) -> dict[str, Any]:
    """The seed ceiling (see the module doc) as a full matrix over ``nets``' layers.

    ``chosen``: :func:`plan_seed_ceiling`; ``pool``: loaded checkpoints by key (a member may be
    taken from ``nets`` instead); ``options`` and ``shortcuts`` as for :func:`analysis.compare`.
    """
    opts = analysis.CompareOptions.build(options, **shortcuts)
    sizes = {label: len(layers[label]) for label in nets}

    def resolve(s: StandIn) -> nn.Module:
        return pool[s.identity] if s.identity in pool else nets[s.label]

    full, blocks = substituted_cka(
        sizes, chosen, resolve, data, opts, device=device, progress=progress, gram_cache=gram_cache
    )
    return {"cka": matrix_json(full), "blocks": blocks}


def undefined_blocks(baselines: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every undefined baseline block: ``{"baseline", "a", "b", "reason"}``."""
    return [
        {"baseline": name, "a": item["a"], "b": item["b"], "reason": item["reason"]}
        for name, stored in baselines.items()
        for item in stored.get("blocks", ())
        if "reason" in item
    ]
