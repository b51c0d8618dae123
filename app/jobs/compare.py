"""The comparison job: every layer pair of every model pair over one dataset.

Loads every checkpoint once (the process LRU), streams the dataset through
:func:`analysis.compare` with the Gram cache under ``DATA_DIR/grams`` (so a model already
computed on the same dataset and batch plan is not run again), and writes the atlas,
diagnostics and provenance in the same transaction that marks the job succeeded. Asked for,
the baselines run through the same pipeline afterwards (:func:`analysis.add_baselines`), the
seed ceiling's siblings taken from every checkpoint in the store. The stored result is the
library's own JSON form (:meth:`analysis.Atlas.to_dict`: q-values, baselines and verdicts
included); progress counts every phase (:func:`analysis.engine.compare.phase_weights`).

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
from analysis.inference.seed_ceiling import CeilingPlan, Identity, needed_siblings, plan_ceiling
from app.jobs import shards
from app.jobs.control import JobControl
from app.jobs.inputs import load_comparison, member_rows, stored_options
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


def _ceiling(
    services: Services, members: dict[str, Identity], layers: dict[str, list[str]]
) -> CeilingPlan:
    """The seed ceiling's plan, its siblings taken from every checkpoint in the store of a
    member's architecture (lowest id first)."""
    archs = {ident.arch for ident in members.values()}
    with services.db.session(readonly=True) as s:
        rows = s.scalars(select(Model).where(Model.arch.in_(archs)).order_by(Model.id)).all()
        candidates = [_identity(r) for r in rows]
    return plan_ceiling(dict(members), layers, candidates)


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
    from analysis.engine.compare import Phases, phase_weights

    params = cmp.params
    rows = member_rows(services, cmp)
    shas = {label: row.sha256 for label, row in rows.items()}
    data = services.datasets.get(dataset_key(ds))
    opts = stored_options(params)
    idents = {label: _identity(row) for label, row in rows.items()}
    wanted = "seed_ceiling" in opts.baselines
    ceiling = _ceiling(services, idents, params["resolved_layers"]) if wanted else None
    phases = Phases(control.on_batch, phase_weights(len(rows), opts, ceiling))
    # Sharded: the first run starts the shards and parks (shards.gather raises Parked); the
    # run after the last shard combines their terms.
    share = phases.weights[0] / sum(phases.weights)  # of the progress, the shards' part
    ranges = shards.plan(services, params, data)
    gathered = shards.gather(services, job, control, cmp.id, ranges, share=share)
    # The members are loaded unless their shards ran them and no baseline needs them.
    members = list(shas.values()) if gathered is None or opts.baselines else []
    extra = needed_siblings(ceiling.chosen, idents) if ceiling is not None else []
    with services.models.lease(members + extra) as loaded:
        nets = {label: loaded[sha] for label, sha in shas.items() if sha in loaded}
        if gathered is not None:
            atlas = analysis.combine(gathered[0])
            control.progress = max(control.progress, share)
        else:
            atlas = run_engine(services, params, nets, shas, data, cache, phases.callback(0))
        if opts.baselines:
            atlas = analysis.add_baselines(
                atlas,
                nets,
                data,
                opts,
                ceiling=ceiling,
                pool=loaded,
                model_keys=shas,
                device=services.device,
                gram_cache=cache,
                on_batch=control.on_batch,
            )
    result = atlas.to_dict()
    blob = json.dumps(result, sort_keys=True, allow_nan=False).encode()
    diagnostics = dict(atlas.diagnostics)
    if gathered is not None:
        diagnostics["shards"] = gathered[1]
    if layer_notes := _layer_diagnostics(result):
        diagnostics["layers"] = layer_notes
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
    if random_init := (atlas.baselines or {}).get("random_init"):
        provenance["random_init"] = {"draws": random_init["draws"], "seeds": random_init["seeds"]}

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
    on_batch: Callable[[int, int], bool | None] | None,
) -> analysis.Atlas:
    """:func:`analysis.compare` of ``nets`` (labels of the comparison, a subset or all) as
    the stored ``params`` ask, through the store's Gram cache, without the baselines.

    The one call of the engine for an unsharded comparison, and for a study's training that
    stores its model's Grams for the study's atlas (:mod:`app.jobs.study_grams`): the same
    options give the same cache keys, so the atlas finds them.
    """
    return analysis.compare(
        nets,
        data,
        analysis.CompareOptions.build(stored_options(params), baselines=()),
        gram_cache=cache,
        model_keys={label: shas[label] for label in nets},
        on_batch=on_batch,
        device=services.device,
    )


def _torch_version() -> str:
    return str(torch.__version__)


def run_comparison(services: Services, job: Job, control: JobControl) -> None:
    cmp, ds = load_comparison(services, job.id)
    cache = StoreGramCache(services.store)
    with gc.refs_kept(services.db, services.store, cmp.id, cache.touched):
        _compare(services, job, cmp, ds, control, cache)
