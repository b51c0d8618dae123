"""A finished study: summary.json, the tidy results table and the plot, from a plan and an atlas.

:func:`summarize` joins a :class:`~analysis.studies.plan.StudyPlan` with what the trainings
produced (``[{"key", "accuracy", "name"}]``: ``name`` is the model's name in the atlas,
defaulting to its key) and an atlas over those models; the statistics are those of
:mod:`analysis.studies.summary`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.studies.plan import Entry, StudyPlan
from analysis.studies.plots import render_plot
from analysis.studies.spec import StudyError
from analysis.studies.summary import (
    AtlasLike,
    ModelRecord,
    cell_intervals,
    diagonal_summary,
    pair_diagonals,
    seed_to_seed_diagonals,
    t_interval,
)

__all__ = ["TABLE_COLUMNS", "StudyResult", "records", "results_table", "summarize"]

TABLE_COLUMNS = (
    "model",
    "key",
    "arm",
    "group",
    "role",
    "arch",
    "family",
    "options",
    "seed",
    "reference_layer",
    "model_layer",
    "cka",
    "ci_low",
    "ci_high",
    "n_references",
)


@dataclass(frozen=True)
class StudyResult:
    """``summary`` (summary.json), ``table`` (results.csv) and ``plots`` ({"png", "svg"} bytes)."""

    summary: dict[str, Any]
    table: pd.DataFrame
    plots: dict[str, bytes]

    def csv(self) -> str:
        return str(self.table.to_csv(index=False))


def _finished(finished: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    out = {}
    for item in finished:
        if "key" not in item:
            raise StudyError("every finished model needs its training 'key'")
        out[str(item["key"])] = item
    return out


def records(plan: StudyPlan, finished: Sequence[Mapping[str, Any]]) -> dict[str, list[ModelRecord]]:
    """Per entry name, one record per seed whose training has finished (others are skipped)."""
    done = _finished(finished)
    out: dict[str, list[ModelRecord]] = {}
    for entry in plan.all_entries():
        rows = []
        for seed, key in entry.keys.items():
            if key in done:
                item = done[key]
                accuracy = item.get("accuracy")
                rows.append(
                    ModelRecord(
                        name=str(item.get("name") or key),
                        key=key,
                        entry=entry.name,
                        seed=seed,
                        accuracy=None if accuracy is None else float(accuracy),
                    )
                )
        out[entry.name] = rows
    return out


def _accuracy(rows: Sequence[ModelRecord]) -> dict[str, Any]:
    return t_interval([r.accuracy for r in rows if r.accuracy is not None])


def _describe(entry: Entry, rows: Sequence[ModelRecord]) -> dict[str, Any]:
    info = entry.structure
    return {
        "name": entry.name,
        "arm": entry.arm,
        "family": entry.family,
        "arch": entry.arch,
        "config": entry.config,
        "point": entry.point,
        "omega": info["omega"],
        "effective_width": info["effective_width"],
        "density": info["density"],
        "S": info["S"],
        "C": info["C"],
        "gamma": info["gamma"],
        "seeds": [r.seed for r in rows],
        "accuracy": _accuracy(rows),
    }


def summary_dict(
    plan: StudyPlan, recs: Mapping[str, Sequence[ModelRecord]], atlas: AtlasLike
) -> dict[str, Any]:
    """The summary.json document of issue 12 §6 (plus a few descriptive keys)."""
    matrix = atlas.matrix
    refs = list(recs[plan.reference.name])
    reference = _describe(plan.reference, refs)
    arms = []
    for entry in plan.entries:
        rows = list(recs[entry.name])
        item = _describe(entry, rows)
        item["cka_diagonal"] = diagonal_summary(pair_diagonals(refs, rows, matrix))
        arms.append(item)
    baseline = diagonal_summary(seed_to_seed_diagonals(refs, matrix))
    spec = plan.spec
    return {
        "study": spec.name,
        "description": spec.description,
        "dataset": plan.dataset,
        "quick": plan.quick,
        "seeds": plan.seeds,
        "plot": spec.plot,
        "cka": plan.cka,
        "reference": reference,
        "arms": arms,
        "baselines": {"seed_to_seed": baseline},
    }


def results_table(
    plan: StudyPlan, recs: Mapping[str, Sequence[ModelRecord]], atlas: AtlasLike
) -> pd.DataFrame:
    """One row per (model, reference layer, model layer): CKA averaged over reference models.

    ``cka`` is the mean over every reference model that is not the model itself of its CKA
    with the model at that layer pair; ``ci_low``/``ci_high`` the 95 % t-interval over those
    reference models (empty with fewer than two); ``n_references`` how many there were.
    """
    refs = list(recs[plan.reference.name])
    rows: list[dict[str, Any]] = []
    for entry in plan.all_entries():
        for rec in recs[entry.name]:
            others = [r for r in refs if r.key != rec.key]
            if not others:
                continue
            blocks = [np.asarray(atlas.matrix(r.name, rec.name), dtype=float) for r in others]
            mean, low, high = cell_intervals(blocks)
            ref_layers = list(atlas.layers[others[0].name])
            model_layers = list(atlas.layers[rec.name])
            common = {
                "model": rec.name,
                "key": rec.key,
                "arm": entry.name,
                "group": entry.arm,
                "role": entry.role,
                "arch": entry.arch,
                "family": entry.family,
                "options": json.dumps(entry.point, sort_keys=True),
                "seed": rec.seed,
                "n_references": len(others),
            }
            for i, ref_layer in enumerate(ref_layers):
                for j, model_layer in enumerate(model_layers):
                    rows.append(
                        {
                            **common,
                            "reference_layer": ref_layer,
                            "model_layer": model_layer,
                            "cka": mean[i, j],
                            "ci_low": low[i, j],
                            "ci_high": high[i, j],
                        }
                    )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def summarize(
    plan: StudyPlan, finished: Sequence[Mapping[str, Any]], atlas: AtlasLike
) -> StudyResult:
    """(summary dict, tidy DataFrame, plot bytes) of a study whose models are in ``atlas``."""
    recs = records(plan, finished)
    if not recs[plan.reference.name]:
        raise StudyError("no reference model has finished, so there is nothing to compare with")
    summary = summary_dict(plan, recs, atlas)
    table = results_table(plan, recs, atlas)
    plots = {fmt: render_plot(summary, fmt) for fmt in ("png", "svg")}
    return StudyResult(summary=summary, table=table, plots=plots)
