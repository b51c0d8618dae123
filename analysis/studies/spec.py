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
    plot: cka_vs_density            # or accuracy_vs_width, or identification
    detect: 0.03                    # optional: the summary says how many seeds detect it
    quick_seeds: 3                  # optional: the seeds of a --quick run (default: seeds)
    identification:                 # optional: the layer-identification test (see below)
      rbf: [0.2, 0.4, 0.8]

A study with ``identification`` (the built-in ``layer_identification``) needs no arms: its
reference arm's seeds are the models, ``reference.arch`` the architecture. Besides the
comparison of ``cka`` (the linear kernel; it gives ``cka`` and the unnormalised linear
``hsic``) it runs one comparison per ``rbf`` multiplier t, the same options with kernel
``rbf:t`` (measure ``cka_rbf_t``), and scores every measure with
:func:`analysis.studies.identification.identification`. ``measures`` defaults to
:data:`analysis.studies.identification.MEASURES`.

In an explicit grid the value ``matched`` of ``density`` is the reference's (1/S + 1/C)/2,
computed from its structure. ``fixed_omega: reference`` takes the reference's Ω. ``detect``
is the smallest difference in diagonal CKA worth detecting: every difference of the summary
then says how many seeds would detect it at 80 % power (:mod:`analysis.studies.power`).
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from analysis.errors import AnalysisError
from analysis.estimators.kernels import RBF_T_MAX, RBF_T_MIN
from analysis.studies.identification import MEASURES, RESAMPLES, check_measures

__all__ = [
    "BUILTIN_STUDIES",
    "MAX_BATCH_SIZE",
    "MAX_EPOCHS",
    "MAX_LR",
    "MAX_SEED",
    "MAX_SEEDS",
    "MAX_TRAININGS",
    "MAX_WEIGHT_DECAY",
    "Arm",
    "FixedOmegaGrid",
    "IdentificationSpec",
    "Recipe",
    "StudyError",
    "StudySpec",
    "load_spec",
]

BUILTIN_STUDIES = ("sparsity", "width", "layer_identification")
_NAME = r"^[a-z0-9][a-z0-9_.-]{0,63}$"

# Bounds of every training a user asks for (a study's recipe, and /v1/trainings), checked
# where the request is parsed, before anything is expanded or queued.
MAX_EPOCHS = 1000
MAX_BATCH_SIZE = 8192
MAX_LR = 10.0
MAX_WEIGHT_DECAY = 10.0  # AdamW's decoupled decay; published recipes use 0.05 to 0.1
MAX_SEED = 2**31 - 1
# One study trains at most MAX_TRAININGS models: (reference + every arm's grid points) × seeds.
MAX_TRAININGS = 128
MAX_SEEDS = MAX_TRAININGS


class StudyError(AnalysisError):
    """A study spec that cannot be read, validated or expanded; one sentence says why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Recipe(_Strict):
    """Training hyper-parameters of :func:`models.training.train`; None: the family's default."""

    epochs: int | None = Field(default=None, ge=1, le=MAX_EPOCHS)
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    lr: float | None = Field(default=None, gt=0.0, le=MAX_LR)
    weight_decay: float | None = Field(default=None, ge=0.0, le=MAX_WEIGHT_DECAY)

    def over(self, base: Recipe) -> Recipe:
        """This recipe's set fields over ``base``."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


class FixedOmegaGrid(_Strict):
    """Widths at one Ω: ``widths`` (SW-MLP: m, or option dicts) or ``shapes`` (Mixer-like)."""

    fixed_omega: int | Literal["reference"]
    widths: list[int | dict[str, Any]] | None = Field(default=None, max_length=MAX_TRAININGS)
    shapes: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TRAININGS)
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

    def points(self) -> int:
        """How many grid points this arm has (1 without a grid), counted, not expanded."""
        if self.grid is None:
            return 1
        if isinstance(self.grid, dict):
            return math.prod(len(values) for values in self.grid.values())
        return len(self.grid.widths or self.grid.shapes or [])

    @model_validator(mode="after")
    def _grid_not_empty(self) -> Arm:
        if isinstance(self.grid, dict):
            for key, values in self.grid.items():
                if not values:
                    raise ValueError(f"grid key '{key}' of arm '{self.name}' has no values")
                if key in self.options:
                    raise ValueError(f"'{key}' is both a fixed option and a grid key")
        return self


class IdentificationSpec(_Strict):
    """The layer-identification test: which measures, which RBF bandwidths, its bootstrap."""

    measures: list[str] = Field(default_factory=lambda: list(MEASURES), min_length=1)
    rbf: list[Annotated[float, Field(ge=RBF_T_MIN, le=RBF_T_MAX)]] = Field(
        default_factory=lambda: [0.2, 0.4, 0.8], max_length=8
    )
    resamples: int = Field(default=RESAMPLES, ge=0, le=100_000)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _known(self) -> IdentificationSpec:
        check_measures(self.measures)
        if len(set(self.rbf)) != len(self.rbf):
            raise ValueError(f"identification.rbf lists a bandwidth twice: {self.rbf}")
        return self


class StudySpec(_Strict):
    """A whole study; see the module docstring for the document's shape."""

    name: str = Field(pattern=_NAME)
    description: str = ""
    dataset: str = "digits"
    recipe: Recipe = Field(default_factory=Recipe)
    quick: Recipe = Field(default_factory=lambda: Recipe(epochs=1))
    seeds: (
        Annotated[int, Field(ge=1, le=MAX_SEEDS)]
        | Annotated[list[Annotated[int, Field(ge=0, le=MAX_SEED)]], Field(max_length=MAX_SEEDS)]
    ) = 3
    reference: Arm
    arms: list[Arm] = Field(default_factory=list)
    cka: dict[str, Any] = Field(default_factory=dict)
    plot: Literal["cka_vs_density", "accuracy_vs_width", "identification"] = "cka_vs_density"
    detect: float | None = Field(default=None, gt=0.0, le=1.0)
    quick_seeds: int | None = Field(default=None, ge=1, le=MAX_SEEDS)
    identification: IdentificationSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if self.reference.grid is not None:
            raise ValueError("the reference arm is one architecture: it takes no grid")
        if not self.arms and self.identification is None:
            raise ValueError("arms is empty: a study needs an arm, or an identification test")
        if self.identification is not None and str(self.cka.get("kernel", "linear")) != "linear":
            raise ValueError(
                "an identification study's cka kernel is linear; RBF bandwidths go in "
                "identification.rbf"
            )
        names = [self.reference.name, *(arm.name for arm in self.arms)]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique (reference included): {names}")
        seeds = self.seed_list()
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            raise ValueError("seeds must be a positive count or distinct non-negative integers")
        self.check_trainings(len(seeds))
        return self

    def check_trainings(self, seeds: int) -> int:
        """The number of trainings with ``seeds`` seeds; ValueError past MAX_TRAININGS."""
        points = 1 + sum(arm.points() for arm in self.arms)
        if points * seeds > MAX_TRAININGS:
            raise ValueError(
                f"the study has {points} architectures × {seeds} seeds = {points * seeds} "
                f"trainings, more than the {MAX_TRAININGS} allowed; use fewer seeds, arms or "
                "grid points"
            )
        return points * seeds

    def seed_list(self, count: int | None = None) -> list[int]:
        """The seeds to train: ``count`` (0..count-1) if given, else the spec's."""
        if count is not None:
            if not 1 <= count <= MAX_SEEDS:
                raise StudyError(f"seeds must be between 1 and {MAX_SEEDS}, not {count}")
            try:
                self.check_trainings(count)
            except ValueError as exc:
                raise StudyError(str(exc)) from None
            return list(range(count))
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


def _sentence(exc: ValidationError) -> str:
    errors = exc.errors()
    # Of a union's errors (seeds: a count or a list), the one about the value, not the type
    # the value is not; pydantic's union member tags are left out of the location.
    error = next((e for e in errors if not e["type"].endswith("_type")), errors[0])
    where = ".".join(
        str(p)
        for p in error["loc"]
        if not (isinstance(p, str) and (p.startswith("constrained-") or "[" in p))
    )
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
