"""Comparison pages: the filtered list (the home page), one atlas, and the new-atlas form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.http.api.options import option_filter, option_suggestions
from app.http.api.views import comparison_view
from app.http.problems import ProblemError
from app.http.web.common import Auth, as_int, as_text, found, paged, services_of
from app.http.web.rendering import render
from app.jobs.requests import ComparisonIn
from app.store import gc, repository
from app.store.cells import QUANTITIES, Cells
from app.store.orm import JOB_STATES, Comparison, Dataset, JobState, Model

__all__ = ["atlas_payload", "router"]

router = APIRouter(include_in_schema=False)
KERNEL_CHOICES = ("linear", "rbf")


def _catalog(request: Request) -> tuple[list[Model], list[Dataset], list[str]]:
    """All models and datasets (for filters and the form), and the kernels in use."""
    with services_of(request).db.session(readonly=True) as s:
        models, _ = repository.list_models(s, limit=500, offset=0)
        datasets, _ = repository.list_datasets(s, limit=500, offset=0)
        kernels = sorted(set(s.scalars(select(Comparison.kernel).distinct())) | set(KERNEL_CHOICES))
    return models, datasets, kernels


@router.get("/")
def comparisons_page(
    request: Request,
    auth: Auth,
    model: str | None = None,
    dataset: str | None = None,
    status: str | None = None,
    kernel: str | None = None,
    option: str | None = None,
    page: str | None = None,
) -> Response:
    """Newest comparisons first, filtered by model, dataset, status, kernel and options
    (``option``: NAME=VALUE filters separated by spaces, as ``GET /v1/comparisons`` reads
    them one by one)."""
    model_id, dataset_id = as_int(model, minimum=1), as_int(dataset, minimum=1)
    state = JobState(status) if status in JOB_STATES else None
    kernel = as_text(kernel, 40)
    wanted = " ".join((as_text(option, 300) or "").split())
    try:
        params = [option_filter(text) for text in wanted.split()]
        refused = None
    except ProblemError as exc:
        params, refused = [], exc.detail
    filters = {"model": model_id, "dataset": dataset_id, "status": state, "kernel": kernel}
    filters["option"] = wanted or None
    models, datasets, kernels = _catalog(request)
    where = {"model_id": model_id, "dataset_id": dataset_id, "status": state, "kernel": kernel}
    rows, pager = paged(
        request, page, "/", filters, repository.list_comparisons, _rows, params=params, **where
    )
    return render(
        request,
        "comparisons.html",
        auth,
        title="Comparisons",
        rows=rows,
        pager=pager,
        filters=filters,
        models=models,
        datasets={d.id: d for d in datasets},
        kernels=kernels,
        statuses=JOB_STATES,
        option_suggestions=option_suggestions(),
        option_refused=refused,
    )


def _rows(s: Session, items: Sequence[Comparison]) -> list[dict[str, Any]]:
    """The comparisons' views, each with the study it belongs to (if any)."""
    studies = repository.studies_of_comparisons(s, [c.id for c in items])
    return [comparison_view(c) | {"study": studies.get(c.id)} for c in items]


@router.get("/comparisons/new")
def new_comparison_page(request: Request, auth: Auth) -> Response:
    """The form that starts a comparison through ``POST /v1/comparisons``."""
    models, datasets, _ = _catalog(request)
    preselect = {
        m for m in (as_int(v, minimum=1) for v in request.query_params.getlist("model")) if m
    }
    return render(
        request,
        "new.html",
        auth,
        title="New comparison",
        models=models,
        datasets=datasets,
        preselect=preselect,
        options=form_options(),
    )


def form_options() -> dict[str, dict[str, Any]]:
    """Each comparison option as the form draws it: choices, bounds, default, description,
    read from the REST schema, which takes them from :class:`analysis.CompareOptions`."""
    props = ComparisonIn.model_json_schema()["properties"]
    out: dict[str, dict[str, Any]] = {}
    for name, prop in props.items():
        out[name] = {
            "choices": prop.get("enum", []),
            "default": prop.get("default"),
            "minimum": prop.get("minimum"),
            "maximum": prop.get("maximum"),
            "description": prop.get("description", ""),
        }
    return out


def atlas_payload(result: dict[str, Any]) -> dict[str, Any]:
    """What the page scripts need from a stored atlas: names, layers, and per model pair the
    CKA block with the blocks of every per-cell quantity that was computed (interval, null,
    baselines); ``has`` says which those are; ``undefined`` why a pair has no baseline."""
    cells = Cells(result)
    has = [key for key in QUANTITIES if cells.has(key)]
    matrices = []
    for a, b in cells.pairs():
        blocks = cells.blocks_json(a, b)
        pair = {"a": a, "b": b, "cka": blocks["cka"], "undefined": cells.undefined(a, b)}
        matrices.append(pair | {k: blocks[k] for k in has})
    random_init = (result.get("baselines") or {}).get("random_init") or {}
    return {
        "random_init_draws": random_init.get("draws"),
        "models": cells.models,
        "layers": cells.layers,
        "n": result.get("n"),
        "has": has,
        "permutations": (result.get("config") or {}).get("permutations") or 0,
        "matrices": matrices,
    }


@router.get("/comparisons/{comparison_id}")
def comparison_page(request: Request, auth: Auth, comparison_id: int) -> Response:
    """The atlas: heatmaps of every model pair, or a live progress bar while it runs."""
    with services_of(request).db.session(readonly=True) as s:
        cmp = found(s, Comparison, comparison_id, auth)
        view = comparison_view(
            cmp,
            gc.comparison_bytes(s, [cmp.id]).get(cmp.id, 0),
            gc.unshared_bytes(s, [cmp.id]).get(cmp.id, 0),
        )
        dataset = s.get(Dataset, cmp.dataset_id)
        result = cmp.result
    payload = atlas_payload(result) if result is not None else None
    summary = Cells(result).summaries() if result is not None else None
    return render(
        request,
        "comparison.html",
        auth,
        title=f"Comparison {comparison_id}",
        cmp=view,
        dataset=dataset,
        atlas=payload,
        summary=summary,
        meta={"id": comparison_id, "status": view["status"], "progress": view["progress"]},
    )
