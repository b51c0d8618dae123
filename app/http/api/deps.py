"""Shared request dependencies: the services, pagination, auth, and row views."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request

from app.http.problems import ProblemError
from app.http.schemas import ID_MAX
from app.http.security import require_admin, require_read, require_write
from app.store.orm import Comparison, Job, JobState, Training
from app.store.services import Services

__all__ = [
    "ADMIN",
    "READ",
    "WRITE",
    "ComparisonId",
    "DatasetId",
    "Limit",
    "ModelId",
    "Offset",
    "StatusFilter",
    "TrainingId",
    "comparison_view",
    "get_services",
    "job_fields",
    "not_found",
    "training_view",
]


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


Svc = Annotated[Services, Depends(get_services)]
Limit = Annotated[int, Query(ge=1, le=500, description="Page size")]
# A list's ``?status=`` filter: one of the job states (their names come from the enum).
StatusFilter = Annotated[JobState | None, Query(alias="status", description="Only this state")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="Items to skip")]
# Ids are 32-bit INTEGER keys: anything outside 1..ID_MAX is refused (422, naming the
# parameter) before it reaches the database, where it would overflow the column type.
ModelId = Annotated[int, Path(ge=1, le=ID_MAX, description="Model id")]
DatasetId = Annotated[int, Path(ge=1, le=ID_MAX, description="Dataset id")]
ComparisonId = Annotated[int, Path(ge=1, le=ID_MAX, description="Comparison id")]
TrainingId = Annotated[int, Path(ge=1, le=ID_MAX, description="Training id")]
READ: dict[str, Any] = {"dependencies": [Depends(require_read)]}
WRITE: dict[str, Any] = {"dependencies": [Depends(require_write)]}
ADMIN: dict[str, Any] = {"dependencies": [Depends(require_admin)]}  # deletes, tokens


def not_found(kind: str, ident: int | str) -> ProblemError:
    return ProblemError(404, "not_found", f"{kind} {ident} does not exist")


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
    }


def comparison_view(cmp: Comparison, size_bytes: int = 0) -> dict[str, Any]:
    """The API's view of a comparison; ``size_bytes``: its stored artifacts (app.store.gc)."""
    base = f"/v1/comparisons/{cmp.id}"
    return {
        "id": cmp.id,
        "dataset_id": cmp.dataset_id,
        "models": [{"id": m.model_id, "label": m.label} for m in cmp.members],
        "params": cmp.params,
        "diagnostics": cmp.diagnostics,
        "provenance": cmp.provenance,
        "created_at": cmp.created_at,
        "size_bytes": size_bytes,
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
