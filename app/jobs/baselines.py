"""Baselines of a comparison: what a CKA value would be without training, or with another seed.

``random_init``
    Every model replaced by an untrained twin of the same architecture and options, its
    weights drawn from a fixed seed (:func:`analysis.baselines.random_init_twin`), run through
    the same pipeline (layers, kernel, estimator, batch plan, features). A trained cell close
    to its twin's value owes little to training: architecture and input alone give it.
``seed_ceiling``
    For a model with a *sibling* (same architecture, same options but the seed, same training
    dataset, another seed), the sibling's CKA with the other side of the cell. In a model's
    block with itself that is the seed-to-seed agreement, the most two trainings of one
    architecture agree; between two models it shows what another seed of one of them gives
    against the other. Where both models of a pair have a sibling, the one earlier in the
    comparison's order is replaced, so the block of (b, a) is the transpose of that of (a, b).
    Cells of pairs where neither model has a sibling are null.

Both are stored as full (L_total, L_total) matrices in the layer order of the atlas, under
``result["baselines"]``, so every reader (matrix endpoint, page, export) slices them the same
way as the CKA itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

import analysis
from analysis.baselines import random_init_twin

__all__ = [
    "SIBLING_PREFIX",
    "Identity",
    "find_siblings",
    "random_init_baseline",
    "seed_ceiling_baseline",
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
) -> dict[str, Identity]:
    """Per member label, its first sibling among ``candidates`` (none: the label is absent)."""
    found = {}
    for label, ident in members.items():
        sib = next((c for c in candidates if ident.is_sibling(c)), None)
        if sib is not None:
            found[label] = sib
    return found


def _jsonable(a: np.ndarray) -> list[list[float | None]]:
    return [[float(v) if np.isfinite(v) else None for v in row] for row in a]


def random_init_baseline(
    nets: Mapping[str, nn.Module],
    data: Any,
    seed: int,
    **compare: Any,
) -> dict[str, Any]:
    """CKA of untrained twins of ``nets`` (weights from ``seed``) under the same options."""
    twins = {label: random_init_twin(net, seed=seed) for label, net in nets.items()}
    atlas = analysis.compare(twins, data, **compare)
    return {"seed": seed, "cka": _jsonable(atlas.cka)}


def seed_ceiling_baseline(
    nets: Mapping[str, nn.Module],
    layers: Mapping[str, Sequence[str]],
    siblings: Mapping[str, tuple[Identity, nn.Module]],
    data: Any,
    *,
    model_keys: Mapping[str, str] | None = None,
    **compare: Any,
) -> dict[str, Any]:
    """The sibling-replaced CKA (see the module doc) as a full matrix over ``nets``' layers.

    ``siblings``: label -> (identity, loaded sibling model). ``model_keys`` (label -> sha256)
    lets the Gram store reuse the comparison's own Grams; siblings are keyed by their own.
    """
    labels = list(nets)
    sizes = [len(layers[label]) for label in labels]
    starts = np.cumsum([0, *sizes])
    total = int(starts[-1])
    full = np.full((total, total), np.nan)
    out: dict[str, Any] = {
        "siblings": {label: sib.describe() for label, (sib, _) in siblings.items()},
        "without_sibling": [label for label in labels if label not in siblings],
    }
    if not siblings:
        out["cka"] = _jsonable(full)
        return out
    combined = dict(nets) | {SIBLING_PREFIX + lb: net for lb, (_, net) in siblings.items()}
    all_layers = {lb: list(v) for lb, v in layers.items()}
    all_layers |= {SIBLING_PREFIX + lb: list(layers[lb]) for lb in siblings}
    keys = None
    if model_keys is not None:
        keys = dict(model_keys) | {
            SIBLING_PREFIX + lb: sib.key for lb, (sib, _) in siblings.items()
        }
    atlas = analysis.compare(combined, data, layers=all_layers, model_keys=keys, **compare)
    for p, a in enumerate(labels):
        for q, b in enumerate(labels):
            first, second = (a, b) if p <= q else (b, a)
            owner = first if first in siblings else second if second in siblings else None
            if owner is None:
                continue
            if owner == a:
                block = atlas.matrix(SIBLING_PREFIX + a, b)
            else:
                block = atlas.matrix(a, SIBLING_PREFIX + b)
            full[starts[p] : starts[p + 1], starts[q] : starts[q + 1]] = block
    out["cka"] = _jsonable(full)
    return out
