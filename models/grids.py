"""Grids at a fixed number of connections Ω: many effective widths, one Ω.

Hayase & Karakida vary the effective width m = S·C while holding Ω fixed. Here a grid point is
a set of options for a preset; each is checked by building the model on the meta device, and
carries the Ω it *really* has (:func:`models.structure`), not the target.

- SW-MLP (``sw_mlp_*``): for each width m (S from the patching in ``fixed``, C = m / S; or an
  explicit ``{"patch_size": ..., "embed_dim": ...}``) the density is p = Ω / (γ·m²), so each
  masked weight keeps round(p·γ·m²) = Ω ones. Widths too narrow to hold Ω (p > 1) give no point.
- Mixer / RP-Mixer (``mixer_*``, ``rp_mixer_*``): for each shape (e.g. ``{"patch_size": 4}``,
  which sets S) C solves (γt·C·S² + γc·C²·S)/2 = Ω; gMLP: γ·C·S·(3C + S)/6 = Ω. The whole C
  nearest the root (among those the options allow) whose real Ω is closest wins. A shape that
  names ``embed_dim`` itself is taken as it is.

A point whose real Ω is off the target by more than ``tolerance`` (10 % by default) is dropped,
or kept with ``within_tolerance=False`` when ``keep_all`` is set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from models._builder import PRESETS
from models.errors import ConfigError
from models.options import structure, validate_config

__all__ = ["DEFAULT_TOLERANCE", "GridPoint", "fixed_omega_grid"]

DEFAULT_TOLERANCE = 0.10
_SEARCH = 3  # whole values of C tried on either side of the real root


@dataclass(frozen=True)
class GridPoint:
    """Options of one point (beyond the arm's fixed ones), its real Ω and its structure."""

    options: dict[str, Any]
    omega: int
    target: int
    structure: dict[str, Any] = field(default_factory=dict)

    @property
    def relative_error(self) -> float:
        """(real Ω − target) / target."""
        return (self.omega - self.target) / self.target

    def within(self, tolerance: float = DEFAULT_TOLERANCE) -> bool:
        return abs(self.relative_error) <= tolerance


def _point(arch: str, fixed: Mapping[str, Any], options: dict[str, Any], target: int) -> GridPoint:
    info = structure(arch, {**fixed, **options})
    if info["omega"] is None:
        raise ConfigError(f"{arch} has no Ω, so it cannot be placed on a fixed-Ω grid")
    return GridPoint(options=options, omega=int(info["omega"]), target=target, structure=info)


def _sw_mlp_points(
    arch: str, fixed: Mapping[str, Any], omega: int, widths: Sequence[Any]
) -> list[GridPoint]:
    base = validate_config(arch, {**fixed, "density": 1.0})
    tokens = (base["img_size"] // base["patch_size"]) ** 2
    gamma = float(base["mlp_ratio"])
    points = []
    for width in widths:
        if isinstance(width, Mapping):
            shape = dict(width)
            m = int(structure(arch, {**fixed, **shape, "density": 1.0})["effective_width"])
        else:
            m = int(width)
            if m < 1 or m % tokens:
                raise ConfigError(
                    f"width {width} of {arch} is not a positive multiple of its S = {tokens} tokens"
                )
            shape = {"embed_dim": m // tokens}
        density = omega / (gamma * m * m)
        if density > 1.0:
            continue  # too narrow: even dense, this width has fewer than Ω connections
        points.append(_point(arch, fixed, {**shape, "density": density}, omega))
    return points


def _root(family: str, config: Mapping[str, Any], omega: int) -> float:
    """The real C that gives Ω for this family at the config's S and expansions."""
    s = (config["img_size"] // config["patch_size"]) ** 2
    if family == "gmlp":
        g = float(config["mlp_ratio"])
        a, b = g * s / 2.0, g * s * s / 6.0
    else:
        a, b = float(config["channel_expansion"]) * s / 2.0, float(config["token_expansion"])
        b *= s * s / 2.0
    return (-b + math.sqrt(b * b + 4.0 * a * omega)) / (2.0 * a)


def _mixer_point(
    arch: str, family: str, fixed: Mapping[str, Any], omega: int, shape: Mapping[str, Any]
) -> GridPoint | None:
    if "embed_dim" in shape:
        return _point(arch, fixed, dict(shape), omega)
    config = validate_config(arch, {**fixed, **shape})
    root = _root(family, config, omega)
    best: GridPoint | None = None
    for dim in range(max(1, math.floor(root) - _SEARCH), math.ceil(root) + _SEARCH + 1):
        try:
            point = _point(arch, fixed, {**shape, "embed_dim": dim}, omega)
        except ConfigError:
            continue  # e.g. γc·C not whole for this C
        if best is None or abs(point.omega - omega) < abs(best.omega - omega):
            best = point
    return best


def fixed_omega_grid(
    arch: str,
    omega: int,
    *,
    widths: Sequence[int | Mapping[str, Any]] | None = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    fixed: Mapping[str, Any] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    keep_all: bool = False,
) -> list[GridPoint]:
    """Grid points of preset ``arch`` at Ω = ``omega``: ``widths`` (SW-MLP) or ``shapes``.

    ``fixed`` holds the options every point shares (e.g. ``{"img_size": 12}``); each point's
    ``options`` are what it adds. Points are returned in the order given, minus those whose
    real Ω is not within ``tolerance`` of ``omega`` (unless ``keep_all``).
    """
    if omega < 1:
        raise ConfigError(f"a fixed-Ω grid needs a positive Ω, not {omega}")
    if arch not in PRESETS:
        raise ConfigError(f"fixed-Ω grids are defined for the presets, not '{arch}'")
    family = PRESETS[arch]
    fixed = dict(fixed or {})
    if family == "sw_mlp":
        if not widths:
            raise ConfigError(f"a fixed-Ω grid of {arch} takes 'widths' (effective widths m)")
        points = _sw_mlp_points(arch, fixed, omega, widths)
    elif family in ("mixer", "rp_mixer", "gmlp"):
        if not shapes:
            raise ConfigError(f"a fixed-Ω grid of {arch} takes 'shapes' (e.g. patch sizes)")
        found = [_mixer_point(arch, family, fixed, omega, shape) for shape in shapes]
        points = [p for p in found if p is not None]
    else:
        raise ConfigError(f"{arch} has Ω = γ·m² at every width, so it has no fixed-Ω grid")
    return points if keep_all else [p for p in points if p.within(tolerance)]
