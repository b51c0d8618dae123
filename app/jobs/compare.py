"""The comparison job: the library's comparison plan, run with the store as its hooks.

The job plans the comparison as the library does (:func:`app.jobs.inputs.comparison_plan`:
:func:`analysis.plan_comparison` over the members' rows) and runs it
(:func:`analysis.run_comparison`), supplying only what the library cannot know
(:class:`analysis.Hooks`): the networks are the store's checkpoints, leased from the process's
LRU, and the seed ceiling's siblings any checkpoint of the store
(:class:`app.jobs.inputs.StoreNetworks`); stored Grams live under ``DATA_DIR/grams`` (so a model
already computed on the same dataset and batch plan is not run again); progress and cancel are
the job's (:meth:`app.jobs.control.JobControl.on_batch`); a sharded plan's run step is spread
over shard jobs (:func:`app.jobs.shards.gather`); and the result is written, with its
diagnostics and provenance, in the transaction that marks the job succeeded. The stored result
is the library's own JSON form (:meth:`analysis.Atlas.to_dict`: q-values, baselines and
verdicts included).

A sharded comparison comes here twice: the first run starts its shards and parks the job; the
run after the last shard combines their terms instead of running the models, then goes on as
above (baselines, diagnostics with every shard listed).
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import torch
from sqlalchemy.orm import Session

import analysis
from app.jobs import shards
from app.jobs.control import JobControl
from app.jobs.inputs import StoreNetworks, comparison_plan, load_comparison
from app.jobs.queue import LostJob
from app.store import gc
from app.store.artifacts import StoreDecodedCache, StoreGramCache
from app.store.datasets import dataset_key
from app.store.orm import Comparison, Dataset, Job
from app.store.services import Services

__all__ = ["code_version", "run_comparison"]


def code_version() -> str:
    try:
        return metadata.version("cka-atlas")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


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


def run_comparison(services: Services, job: Job, control: JobControl) -> None:
    cmp, ds = load_comparison(services, job.id)
    cache = StoreGramCache(services.store)
    data = services.datasets.get(dataset_key(ds))
    with gc.refs_kept(services.db, services.store, cmp.id, cache.touched):
        plan, _ = comparison_plan(services, cmp, data)
        gathered: list[dict[str, Any]] = []  # the shards' details, when the plan has shards

        def run_shards(plan: analysis.ComparisonPlan) -> Sequence[analysis.Partial] | None:
            """Start the plan's shards and park (the first time), their partials once they
            have all run, or None for a plan in one piece."""
            share = plan.progress(None).share("random_init")  # the run's part of the progress
            found = shards.gather(services, job, control, cmp.id, plan, share)
            if found is None:
                return None
            control.progress = max(control.progress, share)
            gathered.extend(found[1])
            return found[0]

        def write(atlas: analysis.Atlas) -> None:
            provenance = _provenance(services, control, plan, ds, data, atlas)
            _write(services, control, cmp.id, atlas, provenance, cache, gathered)

        hooks = analysis.Hooks(
            StoreNetworks(services),
            device=services.device,
            gram_cache=cache,
            decoded_cache=StoreDecodedCache(services.store, cache.touched),
            on_batch=control.on_batch,
            shards=run_shards,
            write=write,
        )
        analysis.run_comparison(plan, data, hooks)
    if gathered:
        shards.discard(services, cmp.id)


def _provenance(
    services: Services,
    control: JobControl,
    plan: analysis.ComparisonPlan,
    ds: Dataset,
    data: Any,
    atlas: analysis.Atlas,
) -> dict[str, Any]:
    """Where the result comes from: checkpoints, dataset (and what each model read of it: its
    images as they are, or through the model's pipeline, with an array's value range), code,
    device and precision."""
    provenance = {
        "checkpoints": {m.label: m.key for m in plan.members},
        "dataset": {"id": ds.id, "name": ds.name, "sha256": data.sha256, "n": len(data)},
        "input": atlas.config.get("input"),
        "code_version": code_version(),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "device": services.device,
        "dtype": atlas.config.get("dtype") or "float32",
        "accumulator": "float64",
        "worker": control.worker_id,
    }
    if random_init := (atlas.baselines or {}).get("random_init"):
        provenance["random_init"] = {"draws": random_init["draws"], "seeds": random_init["seeds"]}
    return provenance


def _write(
    services: Services,
    control: JobControl,
    comparison_id: int,
    atlas: analysis.Atlas,
    provenance: dict[str, Any],
    cache: StoreGramCache,
    shard_details: list[dict[str, Any]],
) -> None:
    """The atlas, its diagnostics and ``provenance``, written as the job succeeds."""
    result = atlas.to_dict()
    blob = json.dumps(result, sort_keys=True, allow_nan=False).encode()
    diagnostics = dict(atlas.diagnostics)
    if shard_details:
        diagnostics["shards"] = shard_details
    if layer_notes := _layer_diagnostics(result):
        diagnostics["layers"] = layer_notes

    def write(s: Session) -> None:
        row = s.get(Comparison, comparison_id)
        if row is None:
            raise LostJob(f"comparison {comparison_id} was deleted while running")
        row.result = result
        row.result_sha256 = hashlib.sha256(blob).hexdigest()
        row.diagnostics = diagnostics
        row.provenance = provenance
        gc.record_refs(s, services.store, comparison_id, cache.touched, "gram")

    control.commit(write)
