"""``/v1/comparisons``: submit, list, inspect, cancel and delete CKA atlases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import Query, Response, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.http.api.deps import (
    ComparisonId,
    Paging,
    Requesting,
    StatusFilter,
    Svc,
    api_router,
    not_found,
)
from app.http.api.job_backed import JobBacked
from app.http.api.options import option_filter
from app.http.api.rows import listing, row_or_404
from app.http.api.uploads import answer_registered
from app.http.api.views import comparison_view
from app.http.schemas import ID_MAX, NO_NUL, ComparisonIn, ComparisonOut, Page
from app.http.security import ADMIN, READ, WRITE
from app.jobs.cancel import lock_job
from app.jobs.submit import submit_comparison
from app.store import gc, repository
from app.store.orm import Comparison

__all__ = ["router"]

router = api_router("comparisons")


def _views(s: Session, items: Sequence[Comparison]) -> list[dict[str, Any]]:
    """The comparisons' views, each with the bytes its artifacts take and a delete frees."""
    ids = [c.id for c in items]
    sizes, frees = gc.comparison_bytes(s, ids), gc.unshared_bytes(s, ids)
    return [comparison_view(c, sizes.get(c.id, 0), frees.get(c.id, 0)) for c in items]


COMPARISONS = JobBacked(Comparison, lambda s, cmp: _views(s, [cmp])[0])


@router.post(
    "",
    response_model=ComparisonOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses={200: {"model": ComparisonOut, "description": "An identical comparison exists"}},
    **WRITE,
)
def create_comparison(
    services: Svc, body: ComparisonIn, response: Response, who: Requesting
) -> dict[str, Any]:
    """Validate and queue a comparison (202), or return the identical stored one (200).

    Validation happens here, before anything is queued: models and dataset exist, the layer
    selection resolves on every model, the images fit every model's input, and the batch is
    large enough for the estimator. ``force`` recomputes even when an identical one exists;
    a failed or cancelled identical comparison is always recomputed. The caller is recorded
    as one of the comparison's requesters (``held_by``), of a new one or of the identical one
    still queued or running.
    """
    cmp_id, created = submit_comparison(services, body, requester=who)
    answer_registered(response, f"/v1/comparisons/{cmp_id}", created, new=202)
    return COMPARISONS.view(services, cmp_id)


@router.get("", response_model=Page[ComparisonOut], **READ)
def list_comparisons(
    services: Svc,
    at: Paging,
    model_id: int | None = Query(
        None, ge=1, le=ID_MAX, description="Only comparisons including this model"
    ),
    dataset_id: int | None = Query(None, ge=1, le=ID_MAX, description="Only over this dataset"),
    status_: StatusFilter = None,
    kernel: Annotated[str | None, Query(max_length=40), NO_NUL] = None,
    option: Annotated[
        list[Annotated[str, Query(max_length=300), NO_NUL]],
        Query(
            max_length=20,
            description="NAME=VALUE: only comparisons whose option NAME is VALUE (a list "
            "option, such as baselines, or the layer selection: holds VALUE); repeat to "
            "require several. NAME is any comparison option, e.g. feature=mean_tokens, "
            "estimator=biased, null=permutation, baselines=random_init",
            examples=["feature=mean_tokens"],
        ),
    ] = [],  # noqa: B006 - FastAPI copies a query default; it is never mutated
) -> dict[str, Any]:
    """Newest first. Each comparison's ``options`` are its options that differ from the
    defaults; ``option`` filters on any option."""
    return listing(
        services,
        at,
        repository.list_comparisons,
        _views,
        model_id=model_id,
        dataset_id=dataset_id,
        status=status_,
        kernel=kernel,
        params=[option_filter(text) for text in option],
    )


COMPARISONS.add_routes(
    router,
    ComparisonOut,
    get_doc="Status, progress 0..1, ETA, diagnostics and provenance.",
    cancel_doc="""
    Withdraw your interest: the comparison stops once none of its requesters (``held_by``)
    still wants it — at once if queued, after its current batch if running.

    A token may cancel what it, or a study it owns, requested (403 otherwise); an admin token
    anything: what it did not request, or with ``everyone``, stops for every requester.
    """,
)


@router.delete("/{comparison_id}", status_code=status.HTTP_204_NO_CONTENT, **ADMIN)
def delete_comparison(services: Svc, comparison_id: ComparisonId) -> Response:
    """Delete the comparison and its job; a running job is abandoned without a result. The
    stored Grams, blocks and heatmaps no other comparison uses go with it (its view's
    ``frees_bytes``)."""
    with services.db.session() as s:
        # the job's row lock first (after its ancestors, as its worker's writes take them),
        # then the comparison's: a second delete waits here and then finds no row (404)
        lock_job(s, row_or_404(s, Comparison, comparison_id).job_id)
        locked = select(Comparison.id).where(Comparison.id == comparison_id).with_for_update()
        if s.scalar(locked) is None:
            raise not_found("comparison", comparison_id)
        paths = gc.delete_comparisons(s, [comparison_id])
    gc.release(services.db, services.store, paths)
    return Response(status_code=204)
