"""``/v1/comparisons``: submit, list, inspect, cancel and delete CKA atlases."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from app.http.api.deps import (
    ADMIN,
    READ,
    WRITE,
    ComparisonId,
    Limit,
    Offset,
    StatusFilter,
    Svc,
    comparison_view,
    not_found,
)
from app.http.problems import PROBLEM_RESPONSES
from app.http.schemas import ID_MAX, NO_NUL, ComparisonIn, ComparisonOut, Page
from app.jobs.queue import request_cancel
from app.jobs.submit import submit_comparison
from app.store import gc, repository
from app.store.orm import Comparison

__all__ = ["router"]

router = APIRouter(prefix="/v1/comparisons", tags=["comparisons"], responses=PROBLEM_RESPONSES)


def view(services: Svc, comparison_id: int) -> dict[str, Any]:
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        if cmp is None:
            raise not_found("comparison", comparison_id)
        size = gc.comparison_bytes(s, [comparison_id]).get(comparison_id, 0)
        return comparison_view(cmp, size)


@router.post(
    "",
    response_model=ComparisonOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses={200: {"model": ComparisonOut, "description": "An identical comparison exists"}},
    **WRITE,
)
def create_comparison(services: Svc, body: ComparisonIn, response: Response) -> dict[str, Any]:
    """Validate and queue a comparison (202), or return the identical stored one (200).

    Validation happens here, before anything is queued: models and dataset exist, the layer
    selection resolves on every model, the images fit every model's input, and the batch is
    large enough for the estimator. ``force`` recomputes even when an identical one exists;
    a failed or cancelled identical comparison is always recomputed.
    """
    cmp_id, created = submit_comparison(services, body)
    response.status_code = 202 if created else 200
    response.headers["Location"] = f"/v1/comparisons/{cmp_id}"
    return view(services, cmp_id)


@router.get("", response_model=Page[ComparisonOut], **READ)
def list_comparisons(
    services: Svc,
    limit: Limit = 50,
    offset: Offset = 0,
    model_id: int | None = Query(
        None, ge=1, le=ID_MAX, description="Only comparisons including this model"
    ),
    dataset_id: int | None = Query(None, ge=1, le=ID_MAX, description="Only over this dataset"),
    status_: StatusFilter = None,
    kernel: Annotated[str | None, Query(max_length=40), NO_NUL] = None,
) -> dict[str, Any]:
    """Newest first."""
    with services.db.session(readonly=True) as s:
        items, total = repository.list_comparisons(
            s,
            limit=limit,
            offset=offset,
            model_id=model_id,
            dataset_id=dataset_id,
            status=status_,
            kernel=kernel,
        )
        sizes = gc.comparison_bytes(s, [c.id for c in items])
        views = [comparison_view(c, sizes.get(c.id, 0)) for c in items]
    return {"items": views, "total": total, "limit": limit, "offset": offset}


@router.get("/{comparison_id}", response_model=ComparisonOut, **READ)
def get_comparison(services: Svc, comparison_id: ComparisonId) -> dict[str, Any]:
    """Status, progress 0..1, ETA, diagnostics and provenance."""
    return view(services, comparison_id)


@router.post("/{comparison_id}/cancel", response_model=ComparisonOut, **WRITE)
def cancel_comparison(services: Svc, comparison_id: ComparisonId) -> dict[str, Any]:
    """Cancel at once if queued; a running job stops after its current batch."""
    with services.db.session() as s:
        cmp = s.get(Comparison, comparison_id)
        if cmp is None:
            raise not_found("comparison", comparison_id)
        request_cancel(s, cmp.job_id)
    return view(services, comparison_id)


@router.delete("/{comparison_id}", status_code=status.HTTP_204_NO_CONTENT, **ADMIN)
def delete_comparison(services: Svc, comparison_id: ComparisonId) -> Response:
    """Delete the comparison and its job; a running job is abandoned without a result."""
    with services.db.session() as s:
        if s.get(Comparison, comparison_id) is None:
            raise not_found("comparison", comparison_id)
        paths = gc.referenced_by(s, [comparison_id])
        repository.delete_comparison(s, comparison_id)
    gc.release(services.db, services.store, paths)
    return Response(status_code=204)
