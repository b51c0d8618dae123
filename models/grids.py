"""Grids at a fixed number of connections Ω: many effective widths, one Ω.

Hayase & Karakida vary the effective width m = S·C while holding Ω fixed. Here a grid point is
a set of options for a preset; each is checked by building the model on the meta device, and
carries the Ω it *really* has (:func:`models.structure`), not the target.

How a family places its points is its own (``Family.grid`` in :mod:`models.families`): the
SW-MLP sets the density for each width m, the Mixer-style families solve for C at each
patching (:func:`shape_solver`: the whole C nearest the root of Ω = a·C² + b·C, among those the
options allow, whose real Ω is closest; a shape that names ``embed_dim`` is taken as it is).
Both walk their argument the same way (:func:`point_solver`: one point, or none, per item).

A point whose real Ω is off the target by more than ``tolerance`` (10 % by default) is dropped,
or kept with ``within_tolerance=False`` when ``keep_all`` is set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from models.errors import ConfigError
from models.families import GridSolver, family_of
from models.options import structure, validate_config

__all__ = [
    "DEFAULT_TOLERANCE",
    "GridPoint",
    "PointPlacer",
    "fixed_omega_grid",
    "grid_point",
    "point_solver",
    "shape_solver",
]

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


def grid_point(
    arch: str, fixed: Mapping[str, Any], options: dict[str, Any], target: int
) -> GridPoint:
    """The point ``options`` over ``fixed``, with the Ω a meta build of it really has."""
    info = structure(arch, {**fixed, **options})
    if info["omega"] is None:
        raise ConfigError(f"{arch} has no Ω, so it cannot be placed on a fixed-Ω grid")
    return GridPoint(options=options, omega=int(info["omega"]), target=target, structure=info)


# (arch, Ω, fixed options, one width or shape) -> the grid's point there, or None where none fits.
PointPlacer = Callable[[str, int, Mapping[str, Any], Any], GridPoint | None]


def point_solver(walks: str, items: str, place: PointPlacer) -> GridSolver:
    """A grid solver that places one point (or none) at each item of ``walks``.

    ``walks`` is the argument of :func:`fixed_omega_grid` the family's grid goes along
    (``"widths"`` or ``"shapes"``), ``items`` says what they are for the error when it is
    missing, and ``place`` gives the point at one of them (None where no point fits).
    """

    def solve(
        arch: str,
        omega: int,
        fixed: Mapping[str, Any],
        widths: Sequence[Any] | None,
        shapes: Sequence[Mapping[str, Any]] | None,
    ) -> list[GridPoint]:
        given = widths if walks == "widths" else shapes
        if not given:
            raise ConfigError(f"a fixed-Ω grid of {arch} takes '{walks}' ({items})")
        found = [place(arch, omega, fixed, item) for item in given]
        return [p for p in found if p is not None]

    return solve


def _nearest_c(
    coefficients: Callable[[Mapping[str, Any]], tuple[float, float]],
    arch: str,
    omega: int,
    fixed: Mapping[str, Any],
    shape: Mapping[str, Any],
) -> GridPoint | None:
    if "embed_dim" in shape:
        return grid_point(arch, fixed, dict(shape), omega)
    a, b = coefficients(validate_config(arch, {**fixed, **shape}))
    root = float((-b + math.sqrt(b * b + 4.0 * a * omega)) / (2.0 * a))
    best: GridPoint | None = None
    for dim in range(max(1, math.floor(root) - _SEARCH), math.ceil(root) + _SEARCH + 1):
        try:
            point = grid_point(arch, fixed, {**shape, "embed_dim": dim}, omega)
        except ConfigError:
            continue  # e.g. γc·C not whole for this C
        if best is None or abs(point.omega - omega) < abs(best.omega - omega):
            best = point
    return best


def shape_solver(coefficients: Callable[[Mapping[str, Any]], tuple[float, float]]) -> GridSolver:
    """A grid solver over ``shapes`` for a family whose Ω = a·C² + b·C at a validated config.

    ``coefficients(config)`` gives (a, b) at the config's S and expansions; each shape (e.g.
    ``{"patch_size": 4}``) gets the whole C whose real Ω is closest to the target.
    """
    return point_solver("shapes", "e.g. patch sizes", partial(_nearest_c, coefficients))


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
    owner = family_of(arch)
    if owner is None:
        raise ConfigError(f"fixed-Ω grids are defined for the presets, not '{arch}'")
    if owner.grid is None:
        raise ConfigError(f"{arch} has no fixed-Ω grid")
    points: list[GridPoint] = owner.grid(arch, omega, dict(fixed or {}), widths, shapes)
    return points if keep_all else [p for p in points if p.within(tolerance)]
