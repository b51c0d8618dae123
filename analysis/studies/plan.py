"""Expanding a study spec into trainings, each with a stable key.

Every (arm, grid point, seed) becomes an :class:`Entry` seed; the training behind it is keyed by
sha256 over the canonical JSON of (arch, the full normalised config, seed, dataset sha256,
resolved recipe). Two spellings of one architecture (a default written out or left implicit,
``depth`` or ``num_blocks``) give one key, so a re-run, or another study, finds the checkpoint
it already trained; a different recipe, dataset or option gives another key. Trainings shared
by several entries (the width study's reference is one of its Mixer points) appear once.

:mod:`models` (with torch and timm) is imported by the functions that expand a spec, not with
this module: :func:`training_key` and the plan's types are light.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from analysis.data.datasets import training_data
from analysis.errors import AnalysisError
from analysis.studies.identification import atlas_options
from analysis.studies.spec import Arm, FixedOmegaGrid, Recipe, StudyError, StudySpec, load_spec

__all__ = ["KEY_VERSION", "Entry", "StudyPlan", "Training", "plan", "training_key"]

KEY_VERSION = "cka-atlas-training/1"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def training_key(
    arch: str, config: dict[str, Any], seed: int, dataset_sha256: str, recipe: dict[str, Any]
) -> str:
    """sha256 hex of one training's identity (config as models.validate_config gives it)."""
    identity = {
        "version": KEY_VERSION,
        "arch": arch,
        "config": config,
        "seed": seed,
        "dataset_sha256": dataset_sha256,
        "recipe": recipe,
    }
    return hashlib.sha256(_canonical(identity).encode()).hexdigest()


@dataclass(frozen=True)
class Training:
    """One model to train: pass :meth:`train_kwargs` to :func:`models.training.train`."""

    key: str
    name: str
    arch: str
    family: str
    config: dict[str, Any]
    seed: int
    dataset: str
    dataset_sha256: str
    recipe: dict[str, Any]
    structure: dict[str, Any]

    def train_kwargs(self) -> dict[str, Any]:
        """``train(self.arch, training_data(self.dataset), **kwargs)``: seed, recipe, options."""
        options = {k: v for k, v in self.config.items() if k != "seed"}
        return {"seed": self.seed, **self.recipe, **options}


@dataclass(frozen=True)
class Entry:
    """One point of the summary: the reference or an (arm, grid point), over every seed."""

    name: str
    arm: str
    role: str  # "reference" or "arm"
    arch: str
    family: str
    point: dict[str, Any]
    config: dict[str, Any]  # full normalised config, without the seed
    structure: dict[str, Any]
    keys: dict[int, str]  # seed -> training key


@dataclass(frozen=True)
class StudyPlan:
    """A validated spec expanded: its entries, the unique trainings and the CKA options."""

    spec: StudySpec
    dataset: dict[str, Any]
    seeds: list[int]
    quick: bool
    reference: Entry
    entries: list[Entry]  # the arms' points, in spec order
    trainings: list[Training] = field(default_factory=list)
    cka: dict[str, Any] = field(default_factory=dict)
    # The comparisons over every model, by name: "main" (``cka``), and for an identification
    # study one per RBF bandwidth (analysis.studies.identification.atlas_options).
    atlases: dict[str, dict[str, Any]] = field(default_factory=dict)

    def all_entries(self) -> list[Entry]:
        return [self.reference, *self.entries]


def _dataset(name: str) -> tuple[dict[str, Any], tuple[int, int, int], int]:
    """Identity (as models.training records it), image shape and class count of the data."""
    try:
        # models.train records the train split of a pair (the built-in digits), else the whole.
        data = training_data(name)
        if isinstance(data, tuple):
            data = data[0]
    except AnalysisError as exc:
        raise StudyError(f"study dataset: {exc}") from None
    classes = data.num_classes or 0
    return {"name": name, "sha256": data.sha256}, data.shape, classes


def _recipe(spec: StudySpec, arm: Arm, family: str, quick: bool) -> dict[str, Any]:
    import models

    chosen = arm.recipe.over(spec.recipe)
    if quick:
        chosen = spec.quick.over(chosen)
    base = models.recipe(family)
    defaults = Recipe(
        epochs=base.epochs, batch_size=base.batch_size, lr=base.lr, weight_decay=base.weight_decay
    )
    return chosen.over(defaults).model_dump()


def _label(arm: str, point: dict[str, Any]) -> str:
    if not point:
        return arm
    parts = ",".join(f"{k}={_canonical(v)}" for k, v in point.items())
    return f"{arm}[{parts}]"


def _points(arm: Arm, reference: dict[str, Any], fixed: dict[str, Any]) -> list[dict[str, Any]]:
    import models

    grid = arm.grid
    if grid is None:
        return [{}]
    if isinstance(grid, FixedOmegaGrid):
        target = reference["omega"] if grid.fixed_omega == "reference" else grid.fixed_omega
        points = models.fixed_omega_grid(
            arm.arch,
            int(target),
            widths=grid.widths,
            shapes=grid.shapes,
            fixed=fixed,
            tolerance=grid.tolerance,
        )
        if not points:
            raise StudyError(f"arm '{arm.name}': no grid point within tolerance of Ω = {target}")
        return [p.options for p in points]
    keys = list(grid)
    out = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, values, strict=True))
        if point.get("density") == "matched":
            point["density"] = (1.0 / reference["S"] + 1.0 / reference["C"]) / 2.0
        out.append(point)
    return out


def _check_cka(options: dict[str, Any]) -> dict[str, Any]:
    """Validate with ``analysis.CompareOptions`` where the library has it; else keep as given.

    The options are returned as written (the caller passes them on to the comparison).
    """
    import analysis  # the package itself: CompareOptions may not exist in it yet

    checker: Any = getattr(analysis, "CompareOptions", None)
    if checker is None:
        return dict(options)
    try:
        if hasattr(checker, "model_validate"):
            checker.model_validate(options)
        else:
            checker(**options)
    except (TypeError, ValueError, AnalysisError) as exc:
        raise StudyError(f"study cka options: {exc}") from None
    return dict(options)


def _atlases(spec: StudySpec, cka: dict[str, Any]) -> dict[str, dict[str, Any]]:
    test = spec.identification
    if test is None:
        return {"main": dict(cka)}
    out = atlas_options(cka, test.measures, test.rbf)
    for options in out.values():
        _check_cka(options)
    return out


class _Expander:
    def __init__(self, spec: StudySpec, seeds: list[int], quick: bool, dataset: str) -> None:
        self.spec, self.seeds, self.quick = spec, seeds, quick
        self.identity, self.shape, self.classes = _dataset(dataset)
        self.trainings: dict[str, Training] = {}

    def _fixed(self, arm: Arm) -> dict[str, Any]:
        """The arm's options, with input size and classes following the dataset by default."""
        channels, height, width = self.shape
        fixed = dict(arm.options)
        if height == width:
            fixed.setdefault("img_size", height)
        fixed.setdefault("in_chans", channels)
        if self.classes:
            fixed.setdefault("num_classes", self.classes)
        return fixed

    def entry(self, arm: Arm, role: str, fixed: dict[str, Any], point: dict[str, Any]) -> Entry:
        import models

        try:
            config = models.validate_config(arm.arch, {**fixed, **point})
            info = models.structure(arm.arch, config)
        except models.ConfigError as exc:
            raise StudyError(f"arm '{arm.name}': {exc}") from None
        if (config.get("in_chans"), config.get("img_size"), config.get("img_size")) != self.shape:
            raise StudyError(
                f"arm '{arm.name}': {arm.arch} takes {config.get('in_chans')}×"
                f"{config.get('img_size')}² images; the dataset's are {self.shape}"
            )
        recipe = _recipe(self.spec, arm, info["family"], self.quick)
        name = _label(arm.name, point) if role == "arm" else arm.name
        keys: dict[int, str] = {}
        for seed in self.seeds:
            seeded = {**config, "seed": seed}
            key = training_key(arm.arch, seeded, seed, self.identity["sha256"], recipe)
            keys[seed] = key
            self.trainings.setdefault(
                key,
                Training(
                    key=key,
                    name=f"{name}-s{seed}",
                    arch=arm.arch,
                    family=info["family"],
                    config=seeded,
                    seed=seed,
                    dataset=self.identity["name"],
                    dataset_sha256=self.identity["sha256"],
                    recipe=recipe,
                    structure=info,
                ),
            )
        unseeded = {k: v for k, v in config.items() if k != "seed"}
        return Entry(name, arm.name, role, arm.arch, info["family"], point, unseeded, info, keys)


def plan(
    source: Any, *, seeds: int | None = None, quick: bool = False, dataset: str | None = None
) -> StudyPlan:
    """Expand a spec (anything :func:`load_spec` takes) into entries and unique trainings.

    ``seeds=N`` overrides the spec's seeds with 0..N-1; ``quick`` merges the spec's ``quick``
    recipe over its recipe (other keys, so quick checkpoints never stand in for full ones)
    and takes its ``quick_seeds`` where ``seeds`` is not given; ``dataset`` overrides the
    spec's dataset.
    """
    import models

    spec = load_spec(source)
    if seeds is None and quick and spec.quick_seeds is not None:
        seeds = spec.quick_seeds
    seed_list = spec.seed_list(seeds)
    if not seed_list:
        raise StudyError("a study needs at least one seed")
    expander = _Expander(spec, seed_list, quick, dataset or spec.dataset)
    ref_arm = spec.reference
    reference = expander.entry(ref_arm, "reference", expander._fixed(ref_arm), {})
    entries = []
    for arm in spec.arms:
        fixed = expander._fixed(arm)
        try:
            points = _points(arm, reference.structure, fixed)
        except models.ConfigError as exc:
            raise StudyError(f"arm '{arm.name}': {exc}") from None
        entries += [expander.entry(arm, "arm", fixed, point) for point in points]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise StudyError(f"two grid points of one arm are the same point: {names}")
    cka = _check_cka(spec.cka)
    return StudyPlan(
        spec=spec,
        dataset=expander.identity,
        seeds=seed_list,
        quick=quick,
        reference=reference,
        entries=entries,
        trainings=list(expander.trainings.values()),
        cka=cka,
        atlases=_atlases(spec, cka),
    )
