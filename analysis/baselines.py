"""Baselines that give a CKA value a reference: what architecture and input alone produce.

:func:`random_init_twin` builds an untrained, seeded copy of a model with the same architecture
and options (from its ``atlas_config``, as :func:`models.create` records it). Running the same
comparison on twins gives the ``random_init`` baseline: a trained cell near its twin's value
owes little to training.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from analysis.errors import AnalysisError

__all__ = ["random_init_twin"]


def random_init_twin(model: nn.Module, seed: int = 0) -> nn.Module:
    """An untrained model of ``model``'s architecture and options, its weights drawn from ``seed``.

    Presets take the seed as their ``seed`` option (so the twin's ``atlas_config`` records it);
    other timm architectures are built while torch's RNG is seeded, and the caller's RNG state
    is restored afterwards. The twin is in eval mode, on the CPU. Raises :class:`AnalysisError`
    for a model that carries no ``atlas_config``.
    """
    import models  # analysis sits above models (models never imports analysis)

    cfg: dict[str, Any] | None = getattr(model, "atlas_config", None)
    if not cfg or "arch" not in cfg:
        raise AnalysisError(
            f"{type(model).__name__} has no atlas_config; build it with models.create or "
            "load it with models.load to get a random-init twin"
        )
    options = dict(cfg.get("config") or {})
    if cfg.get("family") != "timm":
        options["seed"] = seed
        twin = models.create(cfg["arch"], **options)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            twin = models.create(cfg["arch"], **options)
    return twin.eval()
