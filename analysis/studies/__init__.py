"""Studies: the fixed-Ω experiments of Hayase & Karakida as declarative specs, plans and summaries.

A study spec (YAML/JSON, :class:`StudySpec`; built-ins ``sparsity``, ``width`` and
``layer_identification`` ship in ``analysis/studies/builtin/``) names a dataset, a training
recipe, seeds, a reference arm and arms (a preset, fixed options, a grid of explicit values or
of widths at fixed Ω). Running one
takes two calls; everything between them (training, the atlas) belongs to the caller::

    from analysis import studies

    # 1. What to train. Each Training has a stable key over (arch, normalised options, seed,
    #    dataset sha256, recipe): a checkpoint saved under that key is reused by any re-run.
    plan = studies.plan("sparsity", seeds=2, quick=False)    # or a path, YAML text, a dict
    data = analysis.training_data(plan.dataset["name"])
    for t in plan.trainings:
        path = models.train(t.arch, data, out_dir=..., name=t.key, **t.train_kwargs())

    # 2. One atlas over every trained model (model names of your choosing), then the results.
    atlas = analysis.compare({t.key: model_of(t) for t in plan.trainings}, data, **plan.cka)
    finished = [
        {"key": t.key, "name": t.key, "accuracy": acc_of(t), "training": meta_of(t)["training"]}
        for t in plan.trainings
    ]
    result = studies.summarize(plan, finished, atlas)
    result.summary            # summary.json (issue 12 §6): reference, arms, baselines,
                              # matched, differences (analysis.studies.differences, each
                              # with its variance components and its power:
                              # analysis.studies.power), devices (where the trainings ran)
    result.table              # pandas DataFrame: results.csv (result.csv() gives the text)
    result.plots["png"], result.plots["svg"]   # bytes; render_plot(summary, fmt) redraws

``plan(...)`` → :class:`StudyPlan`: ``trainings`` (unique :class:`Training` objects, each
with ``key``, ``arch``, ``dataset``, ``config``, ``seed``, ``recipe``, ``structure`` and
``train_kwargs()``), ``entries`` (the summary's points), ``reference``, ``dataset``
(name, sha256), ``cka`` (the comparison options). The atlas should compare on the dataset's
test split (``load_dataset(plan.dataset["name"], split="test")``).
``summarize(plan, finished, atlas)`` → :class:`StudyResult` (``summary``, ``table``,
``plots``); ``finished`` lists ``{"key", "accuracy", "name", "training"}`` (``name``: the
model's name in the atlas, default the key; ``training``: its sidecar's ``training`` record,
optional, read for the summary's ``devices``); trainings not yet finished are left out of the
statistics. The
atlas may be any object with ``layers`` and ``matrix(a, b)``, like :class:`analysis.Atlas`.
An identification study (``layer_identification``: Kornblith 2019's test, one architecture's
seeds, no arms) compares its models once per entry of ``plan.atlases`` (``main`` and one per RBF
bandwidth); pass the others as ``summarize(plan, finished, atlas, extra={name: atlas})`` and the
summary gets ``identification`` (:mod:`analysis.studies.identification`).
``plan_seeds(spec, pilot, detect=0.03)`` → :class:`SeedPlan`: how many seeds the study needs
to detect a difference at 80 % power, from a pilot run's summary.json
(:mod:`analysis.studies.pilot`; ``cka-atlas study plan`` prints it).
Errors a user can cause are :class:`StudyError` (an :class:`analysis.AnalysisError`) with one
sentence, or a :class:`models.ConfigError` naming the offending option.

The spec and the plan's types import here; the statistics, the table and the plots (scipy,
pandas, matplotlib) are loaded on first use (:mod:`analysis._lazy`), and :mod:`models` when a
plan is expanded, so a service naming ``BUILTIN_STUDIES`` at start-up loads none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis._lazy import lazy_exports

# `plan` is both this function and its module: imported here, so the function keeps the name.
from analysis.studies.plan import KEY_VERSION, Entry, StudyPlan, Training, plan, training_key
from analysis.studies.spec import (
    BUILTIN_STUDIES,
    Arm,
    FixedOmegaGrid,
    Recipe,
    StudyError,
    StudySpec,
    builtin_text,
    load_spec,
)

if TYPE_CHECKING:  # the same names, for type checkers; at run time __getattr__ imports them
    from analysis.studies.pilot import SeedPlan, plan_seeds
    from analysis.studies.plots import PLOT_KINDS, render_plot, render_plots
    from analysis.studies.results import TABLE_COLUMNS, StudyResult, summarize
    from analysis.studies.summary import ModelRecord, diagonal_summary, t_interval

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".pilot": ["SeedPlan", "plan_seeds"],
        ".plots": ["PLOT_KINDS", "render_plot", "render_plots"],
        ".results": ["TABLE_COLUMNS", "StudyResult", "summarize"],
        ".summary": ["ModelRecord", "diagonal_summary", "t_interval"],
    },
)

__all__ = [
    "BUILTIN_STUDIES",
    "KEY_VERSION",
    "PLOT_KINDS",
    "TABLE_COLUMNS",
    "Arm",
    "Entry",
    "FixedOmegaGrid",
    "ModelRecord",
    "Recipe",
    "SeedPlan",
    "StudyError",
    "StudyPlan",
    "StudyResult",
    "StudySpec",
    "Training",
    "builtin_text",
    "diagonal_summary",
    "load_spec",
    "plan",
    "plan_seeds",
    "render_plot",
    "render_plots",
    "summarize",
    "t_interval",
    "training_key",
]
