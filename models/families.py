"""The registry of architecture families: what the generic code asks of a family, in one record.

A family's own module (``models/mixer.py``, ``models/gmlp.py``, ...) holds all it knows — its
option schema, the checks across options, its presets, the γ and density of its structure, the
Ω of its blocks, its fixed-Ω grid solver and its training recipe — and hands them to
:func:`register_family` once, next to the timm factories (``@register_model``) that build its
presets. Option validation (:mod:`models.schema`), structure (:mod:`models.options`,
:mod:`models.connections`), grids (:mod:`models.grids`) and training (:mod:`models.training`)
only look families up here, so adding an architecture touches no generic file::

    register_family(Family(name="toy", options=ToyOptions, presets={"toy_digits": {...}},
                           recipe=Recipe(epochs=5, lr=1e-3), check=_check, gamma=_gamma))

A family's models follow timm's Mixer layout (a ``stem`` with ``num_patches``, ``embed_dim``
channels, ``blocks``), which is what S, C and Ω are read from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from models.errors import ConfigError

__all__ = [
    "DEFAULT_RECIPE",
    "Family",
    "GridSolver",
    "Recipe",
    "family",
    "family_of",
    "list_presets",
    "preset_defaults",
    "recipe",
    "register_family",
    "registered",
]


@dataclass(frozen=True)
class Recipe:
    """Default hyper-parameters of a family's training (any of them can be overridden per run)."""

    epochs: int
    lr: float
    batch_size: int = 64
    weight_decay: float = 0.05
    warmup_fraction: float = 0.05


# The recipe of a timm architecture that is not one of the families' presets.
DEFAULT_RECIPE = Recipe(epochs=20, lr=1e-3)

# (arch, omega, fixed options, widths, shapes) -> the grid's points (models.grids.GridPoint),
# before the tolerance cut.
GridSolver = Callable[
    [str, int, Mapping[str, Any], Sequence[Any] | None, Sequence[Mapping[str, Any]] | None],
    list[Any],
]


def _no_cross_checks(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    return config


def _undefined(config: Mapping[str, Any], *_: int) -> float | None:
    return None


def _not_mine(block: Any, tokens: int, channels: int) -> list[int] | None:
    return None


@dataclass(frozen=True)
class Family:
    """Everything the generic code knows about one architecture family.

    - ``options``: the pydantic model of the options (strict types, every option bounded
      above: a maximum is what keeps a request from asking for petabytes).
    - ``presets``: preset name -> its default config (timm registers the factories).
    - ``check(variant, config)``: the checks across options, on the validated config; returns
      the config with defaults that depend on other options filled in.
    - ``gamma(config, S, C)`` and ``density(config)``: γ and p of :func:`models.structure`.
    - ``block_connections(block, S, C)``: the non-zero weights of each effective layer of one
      block of this family (None for a block it does not know), which makes Ω.
    - ``grid``: the fixed-Ω grid solver; None when the family has no such grid.
    - ``rank``: position in listings (lower first).
    """

    name: str
    options: type[BaseModel]
    presets: Mapping[str, Mapping[str, Any]]
    recipe: Recipe
    check: Callable[[str, dict[str, Any]], dict[str, Any]] = _no_cross_checks
    gamma: Callable[[Mapping[str, Any], int, int], float | None] = _undefined
    density: Callable[[Mapping[str, Any]], float | None] = _undefined
    block_connections: Callable[[Any, int, int], list[int] | None] = _not_mine
    grid: GridSolver | None = None
    rank: int = 100


_FAMILIES: dict[str, Family] = {}


def _unbounded(options: type[BaseModel]) -> list[str]:
    """Options of a schema without a maximum (pydantic ``le`` or ``lt``)."""
    return [
        key
        for key, info in options.model_fields.items()
        if not any(hasattr(m, "le") or hasattr(m, "lt") for m in info.metadata)
    ]


def register_family(record: Family) -> Family:
    """Record ``record`` (once per name); its presets become known to every generic function."""
    if record.name in _FAMILIES or record.name == "timm":
        raise ConfigError(f"family '{record.name}' is already registered")
    unbounded = _unbounded(record.options)
    if unbounded:
        raise ConfigError(f"family '{record.name}' declares options without a maximum: {unbounded}")
    taken = [p for p in record.presets if family_of(p) is not None]
    if taken:
        raise ConfigError(f"presets {taken} of family '{record.name}' are already registered")
    _FAMILIES[record.name] = record
    return record


def registered() -> list[Family]:
    """The registered families, in listing order."""
    return sorted(_FAMILIES.values(), key=lambda f: f.rank)


def family(name: str) -> Family:
    """The family called ``name``."""
    if name not in _FAMILIES:
        raise ConfigError(f"family '{name}' has no declared options")
    return _FAMILIES[name]


def family_of(arch: str) -> Family | None:
    """The family whose preset ``arch`` is, or None (a timm architecture, or unknown)."""
    return next((f for f in _FAMILIES.values() if arch in f.presets), None)


def preset_defaults(arch: str) -> dict[str, Any]:
    """The default config of preset ``arch``."""
    owner = family_of(arch)
    if owner is None:
        raise ConfigError(f"'{arch}' is not a preset")
    return dict(owner.presets[arch])


def recipe(family_name: str) -> Recipe:
    """The training recipe of ``family_name``; timm's default for "timm" or an unknown family."""
    owner = _FAMILIES.get(family_name)
    return DEFAULT_RECIPE if owner is None else owner.recipe


def list_presets() -> list[str]:
    """Names of the families' presets: digits before cifar, families in listing order."""
    order = {f.name: i for i, f in enumerate(registered())}

    def key(name: str) -> tuple[bool, int]:
        owner = family_of(name)
        return (not name.endswith("_digits"), order[owner.name] if owner else len(order))

    return sorted((p for f in _FAMILIES.values() for p in f.presets), key=key)
