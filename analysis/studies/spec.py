"""The study document: what to train, how, with which seeds, and how to compare.

A study spec is YAML or JSON validated by :class:`StudySpec`::

    name: sparsity
    dataset: digits                 # a built-in dataset name or a file
    recipe: {epochs: null, lr: null}  # null: the family's default (models.recipe)
    quick: {epochs: 1}              # merged over recipe by plan(..., quick=True)
    seeds: 3                        # 0, 1, 2 — or an explicit list
    reference: {name: mixer, arch: mixer_digits}
    arms:
      - name: sw_mlp
        arch: sw_mlp_digits
        options: {}                 # fixed options of every point
        grid: {density: [0.015625, matched, 0.125]}   # explicit values (a product over keys)
      - name: sw_mlp_width
        arch: sw_mlp_digits
        grid: {fixed_omega: 24576, widths: [128, 256, 512]}   # or shapes: [{patch_size: 4}]
    cka: {}                         # comparison options, checked by analysis.CompareOptions
    plot: cka_vs_density            # or accuracy_vs_width

In an explicit grid the value ``matched`` of ``density`` is the reference's (1/S + 1/C)/2,
computed from its structure. ``fixed_omega: reference`` takes the reference's Ω.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from analysis.errors import AnalysisError

__all__ = [
    "BUILTIN_STUDIES",
    "Arm",
    "FixedOmegaGrid",
    "Recipe",
    "StudyError",
    "StudySpec",
    "load_spec",
]

BUILTIN_STUDIES = ("sparsity", "width")
_NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class StudyError(AnalysisError):
    """A study spec that cannot be read, validated or expanded; one sentence says why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Recipe(_Strict):
    """Training hyper-parameters of :func:`models.training.train`; None: the family's default."""

    epochs: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    lr: float | None = Field(default=None, gt=0.0)
    weight_decay: float | None = Field(default=None, ge=0.0)

    def over(self, base: Recipe) -> Recipe:
        """This recipe's set fields over ``base``."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


class FixedOmegaGrid(_Strict):
    """Widths at one Ω: ``widths`` (SW-MLP: m, or option dicts) or ``shapes`` (Mixer-like)."""

    fixed_omega: int | Literal["reference"]
    widths: list[int | dict[str, Any]] | None = None
    shapes: list[dict[str, Any]] | None = None
    tolerance: float = Field(default=0.10, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _one_axis(self) -> FixedOmegaGrid:
        if (self.widths is None) == (self.shapes is None):
            raise ValueError("a fixed_omega grid takes exactly one of 'widths' or 'shapes'")
        if isinstance(self.fixed_omega, int) and self.fixed_omega < 1:
            raise ValueError("fixed_omega must be a positive number of connections")
        return self


class Arm(_Strict):
    """A preset, options every point shares, and a grid of points (none: one point)."""

    name: str = Field(pattern=_NAME)
    arch: str
    options: dict[str, Any] = Field(default_factory=dict)
    grid: FixedOmegaGrid | dict[str, list[Any]] | None = None
    recipe: Recipe = Field(default_factory=Recipe)
    description: str = ""

    @model_validator(mode="after")
    def _grid_not_empty(self) -> Arm:
        if isinstance(self.grid, dict):
            for key, values in self.grid.items():
                if not values:
                    raise ValueError(f"grid key '{key}' of arm '{self.name}' has no values")
                if key in self.options:
                    raise ValueError(f"'{key}' is both a fixed option and a grid key")
        return self


class StudySpec(_Strict):
    """A whole study; see the module docstring for the document's shape."""

    name: str = Field(pattern=_NAME)
    description: str = ""
    dataset: str = "digits"
    recipe: Recipe = Field(default_factory=Recipe)
    quick: Recipe = Field(default_factory=lambda: Recipe(epochs=1))
    seeds: int | list[int] = 3
    reference: Arm
    arms: list[Arm] = Field(min_length=1)
    cka: dict[str, Any] = Field(default_factory=dict)
    plot: Literal["cka_vs_density", "accuracy_vs_width"] = "cka_vs_density"

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if self.reference.grid is not None:
            raise ValueError("the reference arm is one architecture: it takes no grid")
        names = [self.reference.name, *(arm.name for arm in self.arms)]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique (reference included): {names}")
        seeds = self.seed_list()
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            raise ValueError("seeds must be a positive count or distinct non-negative integers")
        return self

    def seed_list(self, count: int | None = None) -> list[int]:
        """The seeds to train: ``count`` (0..count-1) if given, else the spec's."""
        if count is not None:
            return list(range(count))
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


def _sentence(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"study spec: {where + ': ' if where else ''}{error['msg']}"


def parse_spec(document: dict[str, Any] | StudySpec) -> StudySpec:
    """Validate a parsed document (a dict) as a :class:`StudySpec`."""
    if isinstance(document, StudySpec):
        return document
    try:
        return StudySpec.model_validate(document)
    except ValidationError as exc:
        raise StudyError(_sentence(exc)) from None


def builtin_text(name: str) -> str:
    """The YAML text of a built-in study."""
    if name not in BUILTIN_STUDIES:
        raise StudyError(f"no built-in study '{name}'; built-in studies are {BUILTIN_STUDIES}")
    return (resources.files("analysis.studies") / "builtin" / f"{name}.yaml").read_text("utf-8")


def load_spec(source: str | Path | dict[str, Any] | StudySpec) -> StudySpec:
    """A built-in study by name, a YAML/JSON file, YAML/JSON text, or a parsed document."""
    if isinstance(source, dict | StudySpec):
        return parse_spec(source)
    text: str
    if isinstance(source, str) and source in BUILTIN_STUDIES:
        text = builtin_text(source)
    elif isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and Path(source).is_file()
    ):
        try:
            text = Path(source).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StudyError(f"cannot read study spec '{source}': {exc}") from None
    elif isinstance(source, str) and "\n" in source:
        text = source
    else:
        raise StudyError(
            f"'{source}' is neither a built-in study ({', '.join(BUILTIN_STUDIES)}) nor a file"
        )
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StudyError(f"study spec is not valid YAML or JSON: {exc}") from None
    if not isinstance(document, dict):
        raise StudyError("a study spec is a mapping (YAML or JSON object)")
    return parse_spec(json.loads(json.dumps(document)))
