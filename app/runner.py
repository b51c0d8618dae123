"""Running jobs: claim, dispatch by kind, record the outcome; and the comparison job itself.

A comparison job loads every checkpoint once (the process LRU), streams the dataset through
:func:`analysis.compare` with the Gram cache under ``DATA_DIR/grams`` (so a model already
computed on the same dataset and batch plan is not run again), and writes the atlas,
diagnostics and provenance in the same transaction that marks the job succeeded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from importlib import metadata

from app import jobs, repository
from app.logs import job_context
from app.orm import Comparison, Dataset, Job, Model
from app.services import Services

__all__ = ["code_version", "dataset_key", "execute", "run_claimed", "run_comparison"]

log = logging.getLogger(__name__)


def code_version() -> str:
    try:
        return metadata.version("cka-atlas")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def dataset_key(ds: Dataset) -> str:
    """The key of a dataset row in :attr:`Services.datasets`."""
    if ds.builtin:
        return f"builtin:{ds.spec}:{ds.split}"
    return f"file:{ds.file_sha256}{ds.file_suffix}"


def _compare(services: Services, cmp: Comparison, ds: Dataset, control: jobs.JobControl) -> None:
    import analysis

    params = cmp.params
    with services.db.session(readonly=True) as s:
        members = [(m.label, s.get(Model, m.model_id)) for m in cmp.members]
    missing = [label for label, row in members if row is None]
    if missing:
        raise analysis.AnalysisError(f"models {missing} were deleted before the job ran")
    shas = {label: row.sha256 for label, row in members}  # type: ignore[union-attr]
    data = services.datasets.get(dataset_key(ds))
    cache = analysis.DirectoryGramCache(services.store.grams)
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
    with services.db.session() as s:
        jobs.complete(s, control.job_id, control.worker_id)
        row = s.get(Comparison, cmp.id)
        if row is None:
            raise jobs.LostJob(f"comparison {cmp.id} was deleted while running")
        row.result = result
        row.result_sha256 = hashlib.sha256(blob).hexdigest()
        row.diagnostics = diagnostics
        row.provenance = provenance


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def run_comparison(services: Services, job: Job, control: jobs.JobControl) -> None:
    with services.db.session(readonly=True) as s:
        cmp = repository.comparison_for_job(s, job.id)
        ds = s.get(Dataset, cmp.dataset_id) if cmp else None
    if cmp is None or ds is None:
        raise jobs.LostJob(f"job {job.id} has no comparison any more")
    _compare(services, cmp, ds, control)


def _run(services: Services, job: Job, control: jobs.JobControl) -> None:
    if job.kind == "comparison":
        run_comparison(services, job, control)
    elif job.kind == "training":
        from app.trainer import run_training

        run_training(services, job, control)
    else:
        raise ValueError(f"unknown job kind {job.kind!r}")


def _error_code(exc: BaseException) -> str:
    from app.problems import _library_code

    if isinstance(exc, OSError):
        return "storage_error"
    if isinstance(exc, ValueError):
        return _library_code(exc)
    return "internal_error"


def execute(services: Services, worker_id: str, job_id: int | None = None) -> Job | None:
    """Claim ``job_id`` (or the oldest queued job), run it, record the outcome.

    Returns the claimed job, or None when there was nothing to claim (already taken,
    finished or cancelled — so a duplicate Celery message is harmless).
    """
    job = jobs.claim(services.db, worker_id, job_id)
    if job is None:
        return None
    run_claimed(services, job, worker_id)
    return job


def run_claimed(services: Services, job: Job, worker_id: str) -> None:
    """Run a job this worker has claimed and record how it ended."""
    import analysis

    interval = min(services.settings.heartbeat_s, 1.0)
    with (
        job_context(job.id, job.kind),  # every log record of this job carries its id
        jobs.JobControl(services.db, job.id, worker_id, interval) as control,
    ):
        log.info("job %s (%s) started on %s", job.id, job.kind, worker_id)
        try:
            _run(services, job, control)
            log.info("job %s succeeded", job.id)
        except analysis.Cancelled:
            jobs.mark_cancelled(services.db, job.id, worker_id)
            log.info("job %s cancelled", job.id)
        except jobs.LostJob as exc:
            log.warning("job %s: %s", job.id, exc)
        except Exception as exc:
            if control.lost:
                log.warning("job %s lost while failing: %s", job.id, exc)
            else:
                code = _error_code(exc)
                if code == "internal_error":
                    log.exception("job %s failed", job.id)
                    message = f"{type(exc).__name__}: {exc}"
                elif code == "storage_error":
                    message = f"the artifact store could not be written: {exc}"
                else:
                    message = str(exc)
                jobs.fail(services.db, job.id, worker_id, message, code)
