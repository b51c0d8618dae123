"""Architecture options checked once, their schema, and a model's structure without its weights.

What the service stores with every model and shows on its page::

    config = models.validate_config("sw_mlp_digits", {"density": 0.125, "depth": 6})
    models.structure("sw_mlp_digits", config)
    # {"family": "sw_mlp", "omega": 65536, "effective_width": 512, "density": 0.125,
    #  "S": 16, "C": 32, "gamma": 2.0}
    models.option_schema("sw_mlp_digits")   # [{"key": "density", "type": "float", ...}, ...]

:func:`validate_config` returns the *full* config (the preset's defaults filled in, aliases
such as ``depth`` renamed, the SW-MLP's default density resolved), so two spellings of one
architecture normalise to one dict. Any timm architecture that is not a preset has no declared
schema: its options are passed through as JSON values and its structure is whatever a meta
build can tell (``None`` where Ω is not defined). What a family contributes (its schema,
checks, γ and density) is looked up in :mod:`models.families`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import timm
import torch
from torch import nn

from models.connections import connections, effective_width
from models.errors import ConfigError, ModelError
from models.factory import create
from models.families import family_of, list_presets
from models.schema import check_options, describe_options

__all__ = [
    "STRUCTURE_KEYS",
    "model_structure",
    "option_schema",
    "shape_config",
    "structure",
    "validate_config",
]

# The keys of :func:`structure`, in the order the service shows them.
STRUCTURE_KEYS = ("family", "omega", "effective_width", "density", "S", "C", "gamma")


def _family(arch: str) -> str:
    owner = family_of(arch)
    if owner is not None:
        return owner.name
    if timm.is_model(arch):
        return "timm"
    raise ConfigError(
        f"unknown architecture '{arch}'; presets are {', '.join(list_presets())}, "
        "and any timm model name works too"
    )


def validate_config(arch: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The full normalised config of ``arch`` with ``config`` applied, or a ConfigError.

    The error is one sentence naming the key: an unknown key, a wrong type, a value out of
    range, or values that do not fit together (a patch size that does not divide the image).
    """
    given = dict(config or {})
    family = _family(arch)
    if family == "timm":
        try:
            return dict(json.loads(json.dumps(given)))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"options {given} for {arch} are not JSON values") from exc
    return check_options(arch, family, dict(_defaults(arch)), given)


def option_schema(arch: str) -> list[dict[str, Any]]:
    """Every option of preset ``arch``: key, type, nullable, default, range, description, aliases.

    ``range`` holds pydantic's bounds (``ge``, ``gt``, ``le``, ``lt``); a timm architecture
    that is not a preset has no declared options (an empty list).
    """
    family = _family(arch)
    if family == "timm":
        return []
    return describe_options(family, _defaults(arch))


def shape_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without its seed: what decides a model's layers and shapes.

    A seed draws weights (and an SW-MLP's masks, an RP-Mixer's permutations), never a shape,
    so what is cached per shape (a structure, a budget, a weightless skeleton) is kept under
    this and serves every seed of a configuration.
    """
    return {k: v for k, v in config.items() if k != "seed"}


def _defaults(arch: str) -> dict[str, Any]:
    owner = family_of(arch)
    assert owner is not None  # callers checked that arch is a preset
    return dict(owner.presets[arch])


def _count(fn: Any, model: nn.Module) -> int | None:
    try:
        return int(fn(model))
    except ModelError:
        return None


def structure(arch: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Ω, effective width, density, S, C, γ and family of ``arch`` under ``config``.

    The model is built on the meta device (no weights are allocated), so this is cheap even
    for ``mlp_cifar``. ``density`` is the SW-MLP's p (1.0 for the dense MLP) and None for the
    other families; ``gamma`` is the expansion γ of the Ω formulas (for a Mixer with
    γt ≠ γc, the γ with Ω = γ·S·C·(S + C)/2).
    """
    full = validate_config(arch, config)
    return dict(_structure(arch, json.dumps(shape_config(full), sort_keys=True)))


@lru_cache(maxsize=1024)
def _structure(arch: str, config_json: str) -> dict[str, Any]:
    """Structure of a validated config (cached: a meta build costs tens of milliseconds)."""
    full = json.loads(config_json)
    with torch.device("meta"):
        model = create(arch, **full)
    return _measure(model, arch, full)


def model_structure(model: nn.Module) -> dict[str, Any]:
    """:func:`structure` of a model already built (by :func:`models.create` or ``load``).

    The model is measured as it is, so a timm architecture gets what its layout defines (S and
    C from a Mixer-style stem, Ω where its blocks are a family's) and None elsewhere.
    """
    atlas = getattr(model, "atlas_config", None) or {}
    arch = str(atlas.get("arch", ""))
    return _measure(model, arch, dict(atlas.get("config") or {}))


def _measure(model: nn.Module, arch: str, config: dict[str, Any]) -> dict[str, Any]:
    owner = family_of(arch)
    stem = getattr(model, "stem", None)
    tokens = getattr(stem, "num_patches", None)
    channels = getattr(model, "embed_dim", None)
    density = gamma = None
    if owner is not None:
        density = owner.density(config)
        if tokens is not None and channels is not None:
            gamma = owner.gamma(config, int(tokens), int(channels))
    return {
        "family": owner.name if owner is not None else "timm",
        "omega": _count(connections, model),
        "effective_width": _count(effective_width, model),
        "density": density,
        "S": None if tokens is None else int(tokens),
        "C": None if channels is None else int(channels),
        "gamma": gamma,
    }
