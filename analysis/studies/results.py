"""A finished study: summary.json, the tidy results table and the plot, from a plan and an atlas.

:func:`summarize` joins a :class:`~analysis.studies.plan.StudyPlan` with what the trainings
produced (``[{"key", "accuracy", "name", "training"}]``: ``name`` is the model's name in the
atlas, defaulting to its key; ``training`` the checkpoint sidecar's ``training`` record, of
which the summary's ``devices`` says where the trainings ran) and an atlas over those models;
the statistics are those of :mod:`analysis.studies.summary`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.studies.differences import ArmTable, study_differences
from analysis.studies.identification import LEVEL, score
from analysis.studies.plan import Entry, StudyPlan
from analysis.studies.plots import render_plots
from analysis.studies.power import ALPHA, POWER, difference_power, max_seeds, power_settings
from analysis.studies.spec import StudyError
from analysis.studies.summary import (
    AtlasLike,
    ModelRecord,
    cell_intervals,
    diagonal_summary,
    pair_diagonals,
    pair_table,
    seed_to_seed_diagonals,
    t_interval,
    table_image_terms,
)

__all__ = [
    "TABLE_COLUMNS",
    "StudyResult",
    "differences",
    "matched_entry",
    "records",
    "results_table",
    "summarize",
    "training_devices",
]

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


# What a training record says of where it ran (models.devices.provenance); grouped on all four.
_WHERE = ("device", "device_name", "precision", "deterministic")


def training_devices(
    plan: StudyPlan, finished: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Where the study's finished trainings ran: one row per device, device name, precision
    and determinism, with how many trainings (``trainings``); ``None`` in a row whose
    checkpoints do not say (made before trainings recorded their device). Reused checkpoints
    count where they were trained."""
    keys = {t.key for t in plan.trainings}
    counts: dict[tuple[Any, ...], int] = {}
    for key, item in _finished(finished).items():
        if key not in keys:
            continue
        record = item.get("training")
        record = record if isinstance(record, Mapping) else {}
        where = tuple(record.get(field) for field in _WHERE)
        counts[where] = counts.get(where, 0) + 1
    rows = [dict(zip(_WHERE, where, strict=True)) | {"trainings": n} for where, n in counts.items()]
    return sorted(rows, key=lambda r: (-r["trainings"], str(r["device"]), str(r["device_name"])))


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
        "keys": [r.key for r in rows],
        "accuracy": _accuracy(rows),
    }


def _json_table(table: np.ndarray | None) -> list[list[float | None]] | None:
    if table is None:
        return None
    return [[float(v) if np.isfinite(v) else None for v in row] for row in table]


def _array(table: list[list[float | None]] | None) -> np.ndarray | None:
    if table is None:
        return None
    return np.array([[np.nan if v is None else v for v in row] for row in table], dtype=float)


def matched_entry(plan: StudyPlan) -> str | None:
    """The arm at the reference's matched point: its density (1/S + 1/C)/2 at its width S·C.

    The first entry with that density and the reference's effective width (so also its Ω) and
    not made of the reference's own models; None when the study has no such point.
    """
    ref = plan.reference.structure
    if not ref.get("S") or not ref.get("C"):
        return None
    density = (1.0 / ref["S"] + 1.0 / ref["C"]) / 2.0
    own = set(plan.reference.keys.values())
    for entry in plan.entries:
        info = entry.structure
        if (
            info.get("density") is not None
            and abs(info["density"] - density) <= 1e-9 * density
            and info.get("effective_width") == ref.get("effective_width")
            and not own & set(entry.keys.values())
        ):
            return entry.name
    return None


def differences(
    summary: Mapping[str, Any], *, detect: float | None = None, target: float | None = None
) -> list[dict[str, Any]]:
    """summary.json's ``differences``, from its tables alone (a stored summary recomputes them).

    See :func:`analysis.studies.differences.study_differences`; each item's ``power`` is
    :func:`analysis.studies.power.difference_power` at the summary's ``power`` settings, or at
    ``detect`` and ``target`` power where given.
    """
    settings = power_settings(summary, detect=detect, target=target)
    base = summary["baselines"]["seed_to_seed"]
    baseline = ArmTable(
        "seed_to_seed", _array(base.get("table")), base.get("input_se"), image_terms=_terms(base)
    )
    ref_models = set(summary["reference"].get("keys") or [])
    arms = []
    for arm in summary["arms"]:
        stat = arm.get("cka_diagonal") or {}
        is_ref = bool(ref_models) and set(arm.get("keys") or []) == ref_models
        arms.append(
            ArmTable(
                arm["name"], _array(stat.get("table")), stat.get("input_se"), is_ref, _terms(stat)
            )
        )
    items = study_differences(arms, baseline, summary.get("matched"), 1.0 - settings["alpha"])
    return [{**item, "power": difference_power(item, settings)} for item in items]


def _stat(
    diagonals: Any, table: tuple[np.ndarray | None, float | None], terms: np.ndarray | None
) -> dict[str, Any]:
    return {
        **diagonal_summary(diagonals),
        "table": _json_table(table[0]),
        "input_se": table[1],
        "image_terms": None if terms is None else [float(f"{v:.7g}") for v in terms],
    }


def _terms(stat: Mapping[str, Any]) -> np.ndarray | None:
    found = stat.get("image_terms")
    return None if found is None else np.asarray(found, dtype=float)


def summary_dict(
    plan: StudyPlan, recs: Mapping[str, Sequence[ModelRecord]], atlas: AtlasLike
) -> dict[str, Any]:
    """The summary.json document of issue 12 §6 (plus a few descriptive keys)."""
    matrix = atlas.matrix
    interval = getattr(atlas, "interval", None)
    terms = getattr(atlas, "image_terms", None)
    refs = list(recs[plan.reference.name])
    reference = _describe(plan.reference, refs)
    arms = []
    for entry in plan.entries:
        rows = list(recs[entry.name])
        item = _describe(entry, rows)
        table = pair_table(refs, rows, matrix, interval)
        own = table_image_terms(refs, rows, table[0], terms)
        item["cka_diagonal"] = _stat(pair_diagonals(refs, rows, matrix), table, own)
        arms.append(item)
    base = pair_table(refs, refs, matrix, interval)
    base_terms = table_image_terms(refs, refs, base[0], terms, upper=True)
    baseline = _stat(seed_to_seed_diagonals(refs, matrix), base, base_terms)
    spec = plan.spec
    summary = {
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
        "matched": matched_entry(plan),
        "power": {
            "target": POWER,
            "alpha": ALPHA,
            "detect": spec.detect,
            "max_seeds": max_seeds(len(plan.all_entries())),
        },
    }
    summary["differences"] = differences(summary)
    return summary


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


def identification_summary(
    plan: StudyPlan,
    recs: Mapping[str, Sequence[ModelRecord]],
    atlases: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """summary.json's ``identification`` over the reference's finished seeds
    (:func:`analysis.studies.identification.score`)."""
    test = plan.spec.identification
    assert test is not None
    missing = sorted(set(plan.atlases) - set(atlases))
    if missing:
        raise StudyError(f"the identification study needs its comparisons {missing} too")
    names = [r.name for r in recs[plan.reference.name]]
    try:
        return score(
            names, atlases, test.measures, test.rbf, resamples=test.resamples, seed=test.seed
        )
    except ValueError as exc:
        raise StudyError(f"identification: {exc}") from None


def summarize(
    plan: StudyPlan,
    finished: Sequence[Mapping[str, Any]],
    atlas: AtlasLike,
    extra: Mapping[str, Any] | None = None,
) -> StudyResult:
    """(summary dict, tidy DataFrame, plot bytes) of a study whose models are in ``atlas``.

    ``extra``: the plan's other comparisons by name (an identification study's RBF ones,
    ``plan.atlases`` beyond ``main``), each an atlas over the same models.
    """
    recs = records(plan, finished)
    if not recs[plan.reference.name]:
        raise StudyError("no reference model has finished, so there is nothing to compare with")
    summary = summary_dict(plan, recs, atlas)
    summary["devices"] = training_devices(plan, finished)
    if plan.spec.identification is not None:
        test = plan.spec.identification
        summary["identification"] = identification_summary(
            plan, recs, {**(extra or {}), "main": atlas}
        )
        summary["identification_settings"] = {
            "resamples": test.resamples,
            "seed": test.seed,
            "level": LEVEL,
            "unit": "models",
            "ties": "1/t for a t-way tie that includes the same-depth layer",
        }
    table = results_table(plan, recs, atlas)
    plots = render_plots(summary, ("png", "svg"))
    return StudyResult(summary=summary, table=table, plots=plots)
