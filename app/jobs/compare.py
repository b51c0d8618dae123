"""The comparison job: every layer pair of every model pair over one dataset.

Loads every checkpoint once (the process LRU), streams the dataset through
:func:`analysis.compare` with the Gram cache under ``DATA_DIR/grams`` (so a model already
computed on the same dataset and batch plan is not run again), and writes the atlas,
diagnostics and provenance in the same transaction that marks the job succeeded. Asked for,
the baselines (:mod:`app.jobs.baselines`) run through the same pipeline afterwards and are
stored in the result under ``baselines``.

A sharded comparison (:mod:`app.jobs.shards`) comes here twice: the first run starts its
shards and parks the job; the run after the last shard combines their terms instead of
running the models, then goes on as above (baselines, diagnostics with every shard listed).
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

import analysis
from analysis.baselines import random_init_baseline
from app.jobs import shards
from app.jobs.baselines import (
    Identity,
    find_siblings,
    needed_siblings,
    plan_seed_ceiling,
    seed_ceiling_baseline,
    undefined_blocks,
)
from app.jobs.control import JobControl
from app.jobs.inputs import engine_options, load_comparison, member_rows
from app.jobs.queue import LostJob
from app.store import gc
from app.store.artifacts import StoreGramCache
from app.store.datasets import dataset_key
from app.store.orm import Comparison, Dataset, Job, Model
from app.store.services import Services

__all__ = ["code_version", "run_comparison", "run_engine"]


def code_version() -> str:
    try:
        return metadata.version("cka-atlas")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def _identity(row: Model) -> Identity:
    return Identity.of(row.sha256, row.name, row.arch, row.config, row.sidecar, row.id)


def _siblings(services: Services, members: dict[str, Model]) -> dict[str, list[Identity]]:
    """Per comparison member, its siblings in the store (lowest id first)."""
    archs = {row.arch for row in members.values()}
    with services.db.session(readonly=True) as s:
        rows = s.scalars(select(Model).where(Model.arch.in_(archs)).order_by(Model.id)).all()
        candidates = [_identity(r) for r in rows]
    return find_siblings({label: _identity(row) for label, row in members.items()}, candidates)


def _layer_diagnostics(result: dict[str, Any]) -> dict[str, Any]:
    """Per model and layer, effective dimensionality and top-component share, when computed."""
    out: dict[str, Any] = {}
    for key in ("effective_dim", "top_pc_share"):
        per_model = result.get(key)
        if not per_model:
            continue
        for label, values in per_model.items():
            layers = result["layers"][label]
            slot = out.setdefault(label, {})
            for layer, v in zip(layers, values, strict=True):
                slot.setdefault(layer, {})[key] = v
    return out


def _compare(
    services: Services,
    job: Job,
    cmp: Comparison,
    ds: Dataset,
    control: JobControl,
    cache: StoreGramCache,
) -> None:
    params = cmp.params
    rows = member_rows(services, cmp)
    shas = {label: row.sha256 for label, row in rows.items()}
    data = services.datasets.get(dataset_key(ds))
    # Sharded: the first run starts the shards and parks (shards.gather raises Parked); the
    # run after the last shard combines their terms.
    gathered = shards.gather(services, job, control, cmp.id, shards.plan(services, params, data))
    baselines = list(params.get("baselines") or [])
    layers = params["resolved_layers"]
    idents = {label: _identity(row) for label, row in rows.items()}
    siblings = _siblings(services, rows) if "seed_ceiling" in baselines else {}
    ceiling = plan_seed_ceiling(idents, layers, siblings) if "seed_ceiling" in baselines else None
    common = engine_options(params, services.device)
    for k in ("permutations", "null", "sensitivity"):
        common.pop(k, None)
    plain = common | {"null": "none"}  # a baseline is a reference value, not a test
    stored: dict[str, Any] = {}
    # The members are loaded unless their shards ran them and no baseline needs them.
    members = list(shas.values()) if gathered is None or baselines else []
    extra = needed_siblings(ceiling, idents) if ceiling is not None else []
    with services.models.lease(members + extra) as loaded:
        nets = {label: loaded[sha] for label, sha in shas.items() if sha in loaded}
        if gathered is not None:
            atlas = analysis.combine(gathered[0])
        else:
            atlas = run_engine(services, params, nets, shas, data, cache, control.on_batch)
        if "random_init" in baselines:
            stored["random_init"] = random_init_baseline(
                nets,
                data,
                layers=layers,
                model_keys=shas,
                **_draws(params),
                **plain,
            )
        if ceiling is not None:
            stored["seed_ceiling"] = seed_ceiling_baseline(
                nets, layers, ceiling, loaded, data, gram_cache=cache, **plain
            )
    result = atlas.to_dict()
    if stored:
        result["baselines"] = stored
    blob = json.dumps(result, sort_keys=True, allow_nan=False).encode()
    diagnostics = dict(atlas.diagnostics)
    if gathered is not None:
        diagnostics["shards"] = gathered[1]
    if layer_notes := _layer_diagnostics(result):
        diagnostics["layers"] = layer_notes
    if ceiling is not None:
        diagnostics["siblings"] = {
            label: [s.describe() for s in sibs] for label, sibs in siblings.items()
        }
    if undefined := undefined_blocks(stored):
        diagnostics["undefined_baselines"] = undefined
        diagnostics["warnings"] = [
            *diagnostics.get("warnings", []),
            *_undefined_warnings(undefined),
        ]
    provenance = {
        "checkpoints": shas,
        "dataset": {"id": ds.id, "name": ds.name, "sha256": data.sha256, "n": len(data)},
        "code_version": code_version(),
        "torch": _torch_version(),
        "python": platform.python_version(),
        "device": services.device,
        "dtype": atlas.config.get("dtype") or "float32",
        "accumulator": "float64",
        "worker": control.worker_id,
    }
    if "random_init" in stored:
        provenance["random_init"] = {
            "draws": stored["random_init"]["draws"],
            "seeds": stored["random_init"]["seeds"],
        }

    def write(s: Session) -> None:
        row = s.get(Comparison, cmp.id)
        if row is None:
            raise LostJob(f"comparison {cmp.id} was deleted while running")
        row.result = result
        row.result_sha256 = hashlib.sha256(blob).hexdigest()
        row.diagnostics = diagnostics
        row.provenance = provenance
        gc.record_refs(s, services.store, cmp.id, cache.touched, "gram")

    control.commit(write)
    if gathered is not None:
        shards.discard(services, cmp.id)


def run_engine(
    services: Services,
    params: dict[str, Any],
    nets: dict[str, Any],
    shas: dict[str, str],
    data: Any,
    cache: StoreGramCache,
    on_batch: Callable[[int, int], bool],
) -> analysis.Atlas:
    """:func:`analysis.compare` of ``nets`` (labels of the comparison, a subset or all) as
    the stored ``params`` ask, through the store's Gram cache.

    The one call of the engine for an unsharded comparison, and for a study's training that
    stores its model's Grams for the study's atlas (:mod:`app.jobs.study_grams`): the same
    options give the same cache keys, so the atlas finds them.
    """
    return analysis.compare(
        nets,
        data,
        layers={label: params["resolved_layers"][label] for label in nets},
        bootstrap=params["bootstrap"],
        gram_cache=cache,
        model_keys={label: shas[label] for label in nets},
        on_batch=on_batch,
        **engine_options(params, services.device),
    )


def _draws(params: dict[str, Any]) -> dict[str, Any]:
    """The requested random-init draws; params stored before they existed take the default."""
    draws = params.get("random_init_draws")
    return {"random_init_draws": int(draws)} if draws else {}


def _undefined_warnings(undefined: list[dict[str, Any]]) -> list[str]:
    """One warning per baseline and reason, naming its blocks."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for item in undefined:
        where = item["a"] if item["a"] == item["b"] else f"{item['a']} × {item['b']}"
        grouped.setdefault((item["baseline"], item["reason"]), []).append(where)
    return [
        f"{name.replace('_', ' ')} undefined for {', '.join(blocks)}: {reason}"
        for (name, reason), blocks in grouped.items()
    ]


def _torch_version() -> str:
    return str(torch.__version__)


def run_comparison(services: Services, job: Job, control: JobControl) -> None:
    cmp, ds = load_comparison(services, job.id)
    cache = StoreGramCache(services.store)
    with gc.refs_kept(services.db, services.store, cmp.id, cache.touched):
        _compare(services, job, cmp, ds, control, cache)
