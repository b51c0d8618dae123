"""Running jobs: claim, dispatch by kind, record the outcome; and the comparison job itself.

A comparison job loads every checkpoint once (the process LRU), streams the dataset through
:func:`analysis.compare` with the Gram cache under ``DATA_DIR/grams`` (so a model already
computed on the same dataset and batch plan is not run again), and writes the atlas,
diagnostics and provenance in the same transaction that marks the job succeeded.

How a job ends: succeeded (result written once, retried across a database restart),
failed (an English sentence in ``jobs.error``: bad input, the artifact store read-only or
full, ...), cancelled, or given back to the queue when its worker shuts down or the
database is unreachable — never left half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import threading
from importlib import metadata

from sqlalchemy.orm import Session

from app import jobs, repository
from app.artifacts import StoreError, StoreGramCache
from app.db import is_transient
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

    jobs.commit_result(
        services.db, control.job_id, control.worker_id, write, timeout=retry_s(services)
    )


def retry_s(services: Services) -> float:
    """How long a finished job keeps retrying its final write while the database is away.

    Past the stale horizon another worker may have re-queued the job, and the write would be
    refused anyway.
    """
    return max(services.settings.stale_after_s, 10.0)


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

    if isinstance(exc, StoreError | OSError):
        return "storage_error"
    if isinstance(exc, ValueError):
        return _library_code(exc)
    return "internal_error"


def execute(
    services: Services,
    worker_id: str,
    job_id: int | None = None,
    shutdown: threading.Event | None = None,
) -> Job | None:
    """Claim ``job_id`` (or the oldest queued job), run it, record the outcome.

    Returns the claimed job, or None when there was nothing to claim (already taken,
    finished or cancelled — so a duplicate Celery message is harmless).
    """
    job = jobs.claim(services.db, worker_id, job_id)
    if job is None:
        return None
    run_claimed(services, job, worker_id, shutdown)
    return job


def run_claimed(
    services: Services, job: Job, worker_id: str, shutdown: threading.Event | None = None
) -> None:
    """Run a job this worker has claimed and record how it ended.

    ``shutdown`` set while the job runs stops it at its next batch and puts it back in the
    queue for the next worker.
    """
    interval = min(services.settings.heartbeat_s, 1.0)
    with (
        job_context(job.id, job.kind),  # every log record of this job carries its id
        jobs.JobControl(services.db, job.id, worker_id, interval, shutdown) as control,
    ):
        log.info("job %s (%s) started on %s", job.id, job.kind, worker_id)
        try:
            _run(services, job, control)
            log.info("job %s succeeded", job.id)
        except Exception as exc:
            try:
                _record_end(services, control, exc)
            except Exception as again:  # the database is still away: the job goes stale
                log.error(
                    "job %s: could not record how it ended (%s); it is re-queued once its "
                    "heartbeat is %s s old",
                    job.id,
                    str(again).strip().splitlines()[0] if str(again).strip() else again,
                    services.settings.stale_after_s,
                )


def _record_end(services: Services, control: jobs.JobControl, exc: Exception) -> None:
    import analysis

    db, job_id, worker_id = services.db, control.job_id, control.worker_id
    if isinstance(exc, jobs.LostJob):
        log.warning("job %s: %s", job_id, exc)
    elif control.lost:
        log.warning("job %s lost while failing: %s", job_id, exc)
    elif isinstance(exc, analysis.Cancelled) and control.cancel_requested:
        jobs.mark_cancelled(db, job_id, worker_id)
        log.info("job %s cancelled", job_id)
    elif isinstance(exc, analysis.Cancelled) and control.shutdown.is_set():
        jobs.release(db, job_id, worker_id, timeout=10.0)
        log.info("job %s put back in the queue: its worker is stopping", job_id)
    elif isinstance(exc, analysis.Cancelled):
        jobs.mark_cancelled(db, job_id, worker_id)
        log.info("job %s cancelled", job_id)
    elif is_transient(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("job %s interrupted by the database (%s); re-queued", job_id, first)
        jobs.release(db, job_id, worker_id, timeout=retry_s(services))
    else:
        code = _error_code(exc)
        if code == "internal_error":
            log.exception("job %s failed", job_id, exc_info=exc)
            message = f"{type(exc).__name__}: {exc}"
        elif isinstance(exc, StoreError):
            message = str(exc)
        elif code == "storage_error":
            message = f"the artifact store could not be written: {exc}"
        else:
            message = str(exc)
        log.warning("job %s failed: %s", job_id, message)
        jobs.fail(db, job_id, worker_id, message, code, timeout=retry_s(services))
