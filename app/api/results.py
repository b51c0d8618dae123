"""Results of a finished comparison: the full atlas, one matrix, and rendered heatmaps."""

from __future__ import annotations

import hashlib
import math
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response

from app.api.deps import READ, Svc, not_found
from app.orm import Comparison
from app.problems import PROBLEM_RESPONSES, ProblemError
from app.schemas import MatrixOut

__all__ = ["router"]

router = APIRouter(prefix="/v1/comparisons", tags=["comparisons"], responses=PROBLEM_RESPONSES)
MEDIA = {"png": "image/png", "svg": "image/svg+xml"}


def _atlas(cmp: Comparison) -> Any:
    from analysis import Atlas

    assert cmp.result is not None
    return Atlas.from_dict(cmp.result)


def _finished(services: Svc, comparison_id: int) -> Comparison:
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        if cmp is None:
            raise not_found("comparison", comparison_id)
        if cmp.result is None:
            raise ProblemError(
                409,
                "not_finished",
                f"comparison {comparison_id} is {cmp.job.status}; it has no result yet",
            )
        return cmp


@router.get("/{comparison_id}/result", **READ)
def get_result(services: Svc, comparison_id: int) -> dict[str, Any]:
    """The whole atlas as stored (``analysis.Atlas.to_dict``), with diagnostics and provenance."""
    cmp = _finished(services, comparison_id)
    return {
        "comparison_id": cmp.id,
        "atlas": cmp.result,
        "diagnostics": cmp.diagnostics,
        "provenance": cmp.provenance,
    }


def _pick(cmp: Comparison, key: str, field: str) -> str:
    labels = [m.label for m in cmp.members]
    if key in labels:
        return key
    for m in cmp.members:
        if key == str(m.model_id):
            return m.label
    raise ProblemError(
        422,
        "unknown_model",
        f"{key!r} is not one of this comparison's models {labels}",
        field=field,
    )


def _cell(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


@router.get("/{comparison_id}/matrix", response_model=MatrixOut, **READ)
def get_matrix(
    services: Svc,
    comparison_id: int,
    a: str | None = Query(None, max_length=220, description="Model label or id (default: first)"),
    b: str | None = Query(None, max_length=220, description="Model label or id (default: a)"),
) -> dict[str, Any]:
    """CKA between every layer of model ``a`` (rows) and every layer of model ``b`` (columns)."""
    cmp = _finished(services, comparison_id)
    la = _pick(cmp, a, "a") if a is not None else cmp.members[0].label
    lb = _pick(cmp, b, "b") if b is not None else la
    atlas = _atlas(cmp)
    m = atlas.matrix(la, lb)
    return {
        "comparison_id": cmp.id,
        "a": la,
        "b": lb,
        "rows": list(atlas.layers[la]),
        "cols": list(atlas.layers[lb]),
        "values": [[_cell(v) for v in row] for row in m.tolist()],
    }


@router.get(
    "/{comparison_id}/heatmap.{fmt}",
    response_class=Response,
    responses={
        200: {"content": {"image/png": {}, "image/svg+xml": {}}},
        304: {"description": "Not modified (If-None-Match matched the ETag)"},
    },
    **READ,
)
def get_heatmap(
    services: Svc, request: Request, comparison_id: int, fmt: Literal["png", "svg"]
) -> Response:
    """The atlas heatmap grid, rendered once and cached in the artifact store; has an ETag."""
    cmp = _finished(services, comparison_id)
    key = hashlib.sha256(f"heatmap-v1:{cmp.result_sha256}:{fmt}".encode()).hexdigest()
    etag = f'"{key}"'
    headers = {"ETag": etag, "Cache-Control": "public, max-age=0, must-revalidate"}
    inm = request.headers.get("if-none-match", "")
    if etag in [t.strip() for t in inm.split(",")] or inm.strip() == "*":
        return Response(status_code=304, headers=headers)
    suffix = f".{fmt}"
    path = services.store.path(key, suffix)
    if path.is_file():
        data = path.read_bytes()
    else:
        from analysis.plot import render_atlas

        data = render_atlas(_atlas(cmp), fmt=fmt)
        services.store.put_as(data, key, suffix)
    return Response(content=data, media_type=MEDIA[fmt], headers=headers)
