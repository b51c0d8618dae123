"""Study pages (the list with the start form, one study) and the new-training form.

Writes go through ``/v1`` from the pages' scripts (``study.js``, ``training.js``), as on the
comparison pages; a running study's page polls ``GET /v1/studies/{id}`` for its progress.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from analysis.studies import BUILTIN_STUDIES
from app.http.api.rows import each
from app.http.api.studies import study_view
from app.http.web.common import Auth, found, paged, services_of
from app.http.web.rendering import render
from app.store import repository
from app.store.orm import Dataset, Study

__all__ = ["option_fields", "router"]

router = APIRouter(include_in_schema=False)


@router.get("/studies")
def studies_page(request: Request, auth: Auth, page: str | None = None) -> Response:
    rows, pager = paged(request, page, "/studies", {}, repository.list_studies, each(study_view))
    return render(
        request,
        "studies.html",
        auth,
        title="Studies",
        rows=rows,
        builtins=BUILTIN_STUDIES,
        pager=pager,
    )


@router.get("/studies/{study_id}")
def study_page(request: Request, auth: Auth, study_id: int) -> Response:
    with services_of(request).db.session(readonly=True) as s:
        study = found(s, Study, study_id, auth)
        view = study_view(study, with_summary=True)
        summary = study.summary
        dataset = s.get(Dataset, study.dataset_id)
    return render(
        request,
        "study.html",
        auth,
        title=f"Study {study_id} · {view['name']}",
        study=view,
        summary=summary,
        dataset=dataset,
        meta={"id": study_id, "status": view["status"]},
    )


def option_fields(arch: str) -> list[dict[str, Any]]:
    """The form fields of a preset's options (key, type, default, range, description)."""
    import models

    try:
        return models.option_schema(arch)
    except models.ConfigError:
        return []


@router.get("/trainings/new")
def new_training_page(request: Request, auth: Auth) -> Response:
    import models

    presets = list(models.list_presets())
    with services_of(request).db.session(readonly=True) as s:
        datasets, _ = repository.list_datasets(s, limit=500, offset=0)
    return render(
        request,
        "training_new.html",
        auth,
        title="New training",
        presets=presets,
        options={arch: option_fields(arch) for arch in presets},
        datasets=datasets,
    )
