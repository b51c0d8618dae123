"""``/v1/trainings``: train an architecture through the job system; the result is a model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status

from app.http.api.deps import (
    READ,
    WRITE,
    Limit,
    Offset,
    StatusFilter,
    Svc,
    TrainingId,
    not_found,
    training_view,
)
from app.http.problems import PROBLEM_RESPONSES
from app.http.schemas import Page, TrainingIn, TrainingOut
from app.jobs.queue import request_cancel
from app.jobs.submit import submit_training
from app.store import repository
from app.store.orm import Training

__all__ = ["router"]

router = APIRouter(prefix="/v1/trainings", tags=["trainings"], responses=PROBLEM_RESPONSES)


def _view(services: Svc, training_id: int) -> dict[str, Any]:
    with services.db.session(readonly=True) as s:
        tr = s.get(Training, training_id)
        if tr is None:
            raise not_found("training", training_id)
        return training_view(tr)


@router.post("", response_model=TrainingOut, status_code=status.HTTP_202_ACCEPTED, **WRITE)
def create_training(services: Svc, body: TrainingIn, response: Response) -> dict[str, Any]:
    """Queue a training run; poll the Location until ``status`` is final, then use ``model_id``."""
    tr_id = submit_training(services, body)
    response.headers["Location"] = f"/v1/trainings/{tr_id}"
    return _view(services, tr_id)


@router.get("", response_model=Page[TrainingOut], **READ)
def list_trainings(
    services: Svc,
    limit: Limit = 50,
    offset: Offset = 0,
    status_: StatusFilter = None,
) -> dict[str, Any]:
    with services.db.session(readonly=True) as s:
        items, total = repository.list_trainings(s, limit=limit, offset=offset, status=status_)
        views = [training_view(t) for t in items]
    return {"items": views, "total": total, "limit": limit, "offset": offset}


@router.get("/{training_id}", response_model=TrainingOut, **READ)
def get_training(services: Svc, training_id: TrainingId) -> dict[str, Any]:
    return _view(services, training_id)


@router.post("/{training_id}/cancel", response_model=TrainingOut, **WRITE)
def cancel_training(services: Svc, training_id: TrainingId) -> dict[str, Any]:
    """Cancel a queued training now; a running one stops after its current training step."""
    with services.db.session() as s:
        tr = s.get(Training, training_id)
        if tr is None:
            raise not_found("training", training_id)
        request_cancel(s, tr.job_id)
    return _view(services, training_id)
