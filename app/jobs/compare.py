"""The comparison job: every layer pair of every model pair over one dataset.

Loads every checkpoint once (the process LRU), streams the dataset through
:func:`analysis.compare` with the Gram cache under ``DATA_DIR/grams`` (so a model already
computed on the same dataset and batch plan is not run again), and writes the atlas,
diagnostics and provenance in the same transaction that marks the job succeeded.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata

import torch
from sqlalchemy.orm import Session

import analysis
from app.jobs import states as jobs
from app.store import gc, repository
from app.store.artifacts import StoreGramCache
from app.store.datasets import dataset_key
from app.store.orm import Comparison, Dataset, Job, Model
from app.store.services import Services

__all__ = ["code_version", "run_comparison"]


def code_version() -> str:
    try:
        return metadata.version("cka-atlas")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def _compare(services: Services, cmp: Comparison, ds: Dataset, control: jobs.JobControl) -> None:
    params = cmp.params
    with services.db.session(readonly=True) as s:
        members = [(m.label, s.get(Model, m.model_id)) for m in cmp.members]
    missing = [label for label, row in members if row is None]
    if missing:
        raise analysis.AnalysisError(f"models {missing} were deleted before the job ran")
    shas = {label: row.sha256 for label, row in members}  # type: ignore[union-attr]
    data = services.datasets.get(dataset_key(ds))
    cache = StoreGramCache(services.store)
    with services.models.lease(list(shas.values())) as loaded:
        nets = {label: loaded[sha] for label, sha in shas.items()}
        atlas = analysis.compare(
            nets,
            data,
            layers=params["resolved_layers"],
            kernel=params["kernel"],
            estimator=params["estimator"],
            mode=params["mode"],
            batch_size=params["batch_size"],
            feature=params["feature"],
            bootstrap=params["bootstrap"],
            device=services.device,
            progress=False,
            gram_cache=cache,
            model_keys=shas,
            on_batch=control.on_batch,
        )
    result = atlas.to_dict()
    blob = json.dumps(result, sort_keys=True, allow_nan=False).encode()
    diagnostics = dict(atlas.diagnostics)
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

    def write(s: Session) -> None:
        row = s.get(Comparison, cmp.id)
        if row is None:
            raise jobs.LostJob(f"comparison {cmp.id} was deleted while running")
        row.result = result
        row.result_sha256 = hashlib.sha256(blob).hexdigest()
        row.diagnostics = diagnostics
        row.provenance = provenance
        gc.record_refs(s, services.store, cmp.id, cache.touched, "gram")

    jobs.commit_result(
        services.db,
        control.job_id,
        control.worker_id,
        write,
        timeout=jobs.retry_s(services.settings),
    )


def _torch_version() -> str:
    return str(torch.__version__)


def run_comparison(services: Services, job: Job, control: jobs.JobControl) -> None:
    with services.db.session(readonly=True) as s:
        cmp = repository.comparison_for_job(s, job.id)
        ds = s.get(Dataset, cmp.dataset_id) if cmp else None
    if cmp is None or ds is None:
        raise jobs.LostJob(f"job {job.id} has no comparison any more")
    _compare(services, cmp, ds, control)
