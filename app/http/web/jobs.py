"""The Jobs page: every background job with its parts (shards, a study's trainings) beneath it.

It reads the same rows as ``/v1/jobs``; filtering is by kind and state, paging is over the
jobs that are nobody's part, and cancelling is the page's script calling
``POST /v1/jobs/{id}/cancel`` (a parent's cancel reaches its parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from app.http.web.common import Auth, as_text, paged, services_of
from app.http.web.rendering import render
from app.store import repository
from app.store.orm import Job, JobState

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

# Where the page of what a job produces lives, by the collection job_subjects names.
_SUBJECT_PAGES = {"comparisons": "/comparisons/{}", "studies": "/studies/{}"}


def _row(job: Job, subject: tuple[str, int] | None) -> dict[str, Any]:
    link = None
    if subject is not None:
        collection, ident = subject
        page = _SUBJECT_PAGES.get(collection)
        link = {
            "label": f"{collection.removesuffix('s')} {ident}",
            "href": page.format(ident) if page else f"/v1/{collection}/{ident}",
        }
    return {
        "id": job.id,
        "kind": job.kind,
        "status": job.status,
        "progress": 1.0 if job.status == JobState.SUCCEEDED else float(job.progress),
        "worker": job.worker_id or (job.detail or {}).get("worker"),
        "attempts": job.attempts,
        "created_at": job.created_at,
        "shard": job.shard,
        "cancellable": JobState(job.status).live and not job.cancel_requested,
        "error": job.error,
        "subject": link,
    }


def _rows(s: Session, items: Sequence[Job]) -> list[dict[str, Any]]:
    """The jobs' rows, each with its parts (shards, a study's trainings) beneath it."""
    children = repository.job_children(s, [j.id for j in items])
    every = [*items, *(c for part in children.values() for c in part)]
    subjects = repository.job_subjects(s, [j.id for j in every])
    return [
        {
            **_row(job, subjects.get(job.id)),
            "parts": [_row(c, subjects.get(c.id)) for c in children.get(job.id, [])],
        }
        for job in items
    ]


@router.get("/jobs")
def jobs_page(
    request: Request,
    auth: Auth,
    kind: str | None = None,
    status: str | None = None,
    page: str | None = None,
) -> Response:
    kind_ = as_text(kind, 20)
    states = [s.value for s in JobState]
    status_ = JobState(status) if status in states else None
    filters = {"kind": kind_, "status": status_}
    rows, pager = paged(
        request,
        page,
        "/jobs",
        filters,
        repository.list_jobs,
        _rows,
        kind=kind_,
        status=status_,
        roots=True,
    )
    with services_of(request).db.session(readonly=True) as s:
        kinds = repository.job_kinds(s)
    return render(
        request,
        "jobs.html",
        auth,
        title="Jobs",
        rows=rows,
        kinds=kinds,
        states=states,
        live_states=[state.value for state in JobState if state.live],
        kind=kind_ or "",
        state_filter=status_ or "",
        pager=pager,
    )
