"""``/v1/jobs``: every background job, whatever produces it, with filters and cancel.

The kinds are read from the jobs table (comparison, training, and any later kind), so a
new kind shows up here without a change. Each job links to what it produces, when that is
a comparison or a training.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fastapi import Query
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from app.http.api.deps import Paging, StatusFilter, Svc, api_router
from app.http.api.job_backed import JobBacked
from app.http.api.rows import listing
from app.http.api.views import job_fields
from app.http.schemas import ID_MAX, JobFields, Page
from app.http.security import READ
from app.store import repository
from app.store.orm import Job

__all__ = ["router"]

router = api_router("jobs")


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


@router.get("", response_model=Page[JobOut], **READ)
def list_jobs(
    services: Svc,
    at: Paging,
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
    return listing(
        services,
        at,
        repository.list_jobs,
        _views,
        kind=kind,
        status=status_,
        parent_id=parent_id,
    )


def _views(s: Session, items: Sequence[Job]) -> list[dict[str, Any]]:
    """The jobs' views, each linking to what it produces."""
    subjects = repository.job_subjects(s, [j.id for j in items])
    return [_view(j, subjects.get(j.id)) for j in items]


JOBS = JobBacked(Job, lambda s, job: _views(s, [job])[0], job_of=lambda job: job.id)


@router.get("/kinds", response_model=KindsOut, **READ)
def list_kinds(services: Svc) -> dict[str, Any]:
    """The job kinds present in the database."""
    with services.db.session(readonly=True) as s:
        return {"kinds": repository.job_kinds(s)}


JOBS.add_routes(
    router,
    JobOut,
    cancel_doc="""
    Withdraw your interest in the job; it stops once nobody holds it (``held_by``): at once
    if queued, at its next batch or training step if running. A shard or a study's training
    is cancelled through the job it belongs to: your interest in that is withdrawn.

    A token may cancel what it, or a study it owns, requested (403 otherwise); an admin token
    anything: what it did not request, or with ``everyone``, stops for every requester.
    """,
)
