"""``/v1/trainings``: train an architecture through the job system; the result is a model."""

from __future__ import annotations

from typing import Any

from fastapi import Response, status

from app.http.api.deps import Paging, Requesting, StatusFilter, Svc, api_router
from app.http.api.job_backed import JobBacked
from app.http.api.rows import each, listing
from app.http.api.views import training_view
from app.http.schemas import Page, TrainingIn, TrainingOut
from app.http.security import READ, WRITE
from app.jobs.submit import submit_training
from app.store import repository
from app.store.orm import Training

__all__ = ["router"]

router = api_router("trainings")


TRAININGS = JobBacked(Training, lambda _s, tr: training_view(tr))


@router.post("", response_model=TrainingOut, status_code=status.HTTP_202_ACCEPTED, **WRITE)
def create_training(
    services: Svc, body: TrainingIn, response: Response, who: Requesting
) -> dict[str, Any]:
    """Queue a training run; poll the Location until ``status`` is final, then use ``model_id``."""
    tr_id = submit_training(services, body, requester=who)
    response.headers["Location"] = f"/v1/trainings/{tr_id}"
    return TRAININGS.view(services, tr_id)


@router.get("", response_model=Page[TrainingOut], **READ)
def list_trainings(services: Svc, at: Paging, status_: StatusFilter = None) -> dict[str, Any]:
    return listing(services, at, repository.list_trainings, each(training_view), status=status_)


TRAININGS.add_routes(
    router,
    TrainingOut,
    cancel_doc="""
    Cancel a queued training now; a running one stops after its current training step.

    Only its requester (or an admin token) may; see the comparisons' cancel.
    """,
)
