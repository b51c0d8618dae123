"""The REST views of the rows that carry a job: a comparison, a training, and the job fields
they share (status, progress, ETA); the web pages show the same views."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.http.api.options import differing_options
from app.store.orm import Comparison, Job, JobState, Training

__all__ = ["comparison_view", "held_by", "job_fields", "training_view"]


def held_by(job: Job) -> list[dict[str, Any]]:
    """Who still wants the job: its requesters that have not cancelled (app.jobs.cancel)."""
    return [
        {"requester": r.requester, "label": r.label, "since": r.created_at}
        for r in job.requesters
        if r.withdrawn_at is None
    ]


def job_fields(job: Job) -> dict[str, Any]:
    started, finished = job.started_at, job.finished_at
    eta = None
    if job.status == JobState.RUNNING and started is not None and job.progress > 0:
        elapsed = (datetime.now(UTC) - started).total_seconds()
        eta = max(elapsed * (1 - job.progress) / job.progress, 0.0)
    return {
        "status": job.status,
        "progress": 1.0 if job.status == JobState.SUCCEEDED else float(job.progress),
        "eta_s": eta,
        "error": job.error,
        "error_code": job.error_code,
        "attempts": job.attempts,
        "started_at": started,
        "finished_at": finished,
        "held_by": held_by(job),
    }


def comparison_view(cmp: Comparison, size_bytes: int = 0, frees_bytes: int = 0) -> dict[str, Any]:
    """The API's view of a comparison; ``size_bytes``: its stored artifacts, ``frees_bytes``:
    those only it references, which a delete removes (app.store.gc)."""
    base = f"/v1/comparisons/{cmp.id}"
    return {
        "id": cmp.id,
        "dataset_id": cmp.dataset_id,
        "models": [{"id": m.model_id, "label": m.label} for m in cmp.members],
        "params": cmp.params,
        "options": differing_options(cmp.params),
        "diagnostics": cmp.diagnostics,
        "provenance": cmp.provenance,
        "created_at": cmp.created_at,
        "size_bytes": size_bytes,
        "frees_bytes": frees_bytes,
        "links": {
            "self": base,
            "result": f"{base}/result",
            "matrix": f"{base}/matrix",
            "heatmap_png": f"{base}/heatmap.png",
            "heatmap_svg": f"{base}/heatmap.svg",
            "cells_csv": f"{base}/cells.csv",
            "cells_parquet": f"{base}/cells.parquet",
            "cancel": f"{base}/cancel",
        },
        **job_fields(cmp.job),
    }


def training_view(tr: Training) -> dict[str, Any]:
    return {
        "id": tr.id,
        "arch": tr.arch,
        "dataset_id": tr.dataset_id,
        "params": tr.params,
        "model_id": tr.model_id,
        "training_key": tr.training_key,
        "created_at": tr.created_at,
        **job_fields(tr.job),
    }
