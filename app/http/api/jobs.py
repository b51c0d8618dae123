"""``/v1/jobs``: every background job, whatever produces it, with filters and cancel.

The kinds are read from the jobs table (comparison, training, and any later kind), so a
new kind shows up here without a change. Each job links to what it produces, when that is
a comparison or a training.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from app.http.api.deps import READ, WRITE, Limit, Offset, StatusFilter, Svc, job_fields, not_found
from app.http.problems import PROBLEM_RESPONSES
from app.http.schemas import ID_MAX, JobFields, Page
from app.jobs.queue import request_cancel
from app.store import repository
from app.store.orm import Job

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=PROBLEM_RESPONSES)
JobId = Annotated[int, Path(ge=1, le=ID_MAX, description="Job id")]


class JobOut(JobFields):
    id: int = Field(examples=[12])
    kind: str = Field(examples=["comparison"], description="comparison, training, ...")
    worker: str | None = Field(default=None, description="The worker that ran it last")
    cancel_requested: bool = False
    created_at: datetime
    heartbeat_at: datetime | None = None
    parent_id: int | None = Field(
        default=None,
        description="A shard: its comparison's job; a study's training or atlas: the study's",
    )
    shard: int | None = Field(default=None, description="A shard: its index, from 0")
    detail: dict[str, Any] | None = Field(
        default=None,
        examples=[{"batches": [0, 8], "of": 2, "worker": "celery-w1:host:41:ab12cd34"}],
        description="A shard: its batch range; a study's training: its name, key and position; "
        "once done, the worker, host and seconds",
    )
    links: dict[str, str] = Field(
        examples=[{"self": "/v1/jobs/12", "cancel": "/v1/jobs/12/cancel"}],
        description="self, cancel, the comparison or training it produces, a shard's parent",
    )


class KindsOut(BaseModel):
    kinds: list[str] = Field(examples=[["comparison", "training"]])


def _view(job: Job, subject: tuple[str, int] | None) -> dict[str, Any]:
    base = f"/v1/jobs/{job.id}"
    links = {"self": base, "cancel": f"{base}/cancel"}
    if subject is not None:
        collection, ident = subject
        links[collection.removesuffix("s")] = f"/v1/{collection}/{ident}"
    if job.parent_id is not None:
        links["parent"] = f"/v1/jobs/{job.parent_id}"
    return {
        "id": job.id,
        "kind": job.kind,
        "worker": job.worker_id,
        "cancel_requested": job.cancel_requested,
        "created_at": job.created_at,
        "heartbeat_at": job.heartbeat_at,
        "parent_id": job.parent_id,
        "shard": job.shard,
        "detail": job.detail,
        "links": links,
        **job_fields(job),
    }


def _one(services: Svc, job_id: int) -> dict[str, Any]:
    with services.db.session(readonly=True) as s:
        job = s.get(Job, job_id)
        if job is None:
            raise not_found("job", job_id)
        return _view(job, repository.job_subjects(s, [job_id]).get(job_id))


@router.get("", response_model=Page[JobOut], **READ)
def list_jobs(
    services: Svc,
    limit: Limit = 50,
    offset: Offset = 0,
    kind: str | None = Query(None, pattern="^[a-z_]{1,20}$", description="e.g. training"),
    status_: StatusFilter = None,
    parent_id: int | None = Query(
        None,
        ge=1,
        le=ID_MAX,
        description="Only the children of this job: a comparison's shards, a study's trainings "
        "and atlas",
    ),
) -> dict[str, Any]:
    """Newest first."""
    with services.db.session(readonly=True) as s:
        items, total = repository.list_jobs(
            s, limit=limit, offset=offset, kind=kind, status=status_, parent_id=parent_id
        )
        subjects = repository.job_subjects(s, [j.id for j in items])
        views = [_view(j, subjects.get(j.id)) for j in items]
    return {"items": views, "total": total, "limit": limit, "offset": offset}


@router.get("/kinds", response_model=KindsOut, **READ)
def list_kinds(services: Svc) -> dict[str, Any]:
    """The job kinds present in the database."""
    with services.db.session(readonly=True) as s:
        return {"kinds": repository.job_kinds(s)}


@router.get("/{job_id}", response_model=JobOut, **READ)
def get_job(services: Svc, job_id: JobId) -> dict[str, Any]:
    return _one(services, job_id)


@router.post("/{job_id}/cancel", response_model=JobOut, **WRITE)
def cancel_job(services: Svc, job_id: JobId) -> dict[str, Any]:
    """Cancel at once if queued; a running job stops at its next batch or training step."""
    with services.db.session() as s:
        if s.get(Job, job_id) is None:
            raise not_found("job", job_id)
        request_cancel(s, job_id)
    return _one(services, job_id)
