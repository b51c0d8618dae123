"""Results of a finished comparison: the full atlas, one matrix, heatmaps and cell tables.

The matrix and the heatmaps are what clients read most, so they avoid decoding the stored
atlas per request: the row is read without its ``result`` column, a decoded atlas is kept
per ``result_sha256`` in a small in-process LRU (a result never changes once written), and
a heatmap or a table of cells is rendered once and then read from the artifact store. All
carry an ETag derived from ``result_sha256`` and answer ``If-None-Match`` with 304.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any, Literal

from cachetools import LRUCache
from fastapi import Query, Request, Response
from sqlalchemy.orm import defer

from analysis import Atlas
from analysis.inference.verdicts import VERDICT_KEYS
from analysis.plot import render_atlas
from app.http.api.deps import ComparisonId, Svc, api_router, not_finished
from app.http.api.rows import row_or_404
from app.http.problems import ProblemError
from app.http.schemas import MatrixOut
from app.http.security import READ
from app.store import gc
from app.store.cells import Cells
from app.store.orm import Comparison

__all__ = ["router"]

router = api_router("comparisons")
MEDIA = {"png": "image/png", "svg": "image/svg+xml"}
TABLE_MEDIA = {"csv": "text/csv; charset=utf-8", "parquet": "application/vnd.apache.parquet"}
ATLAS_CACHE_SIZE = 16
# The answer to an If-None-Match that names the current ETag, in each cached endpoint's document.
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not modified (If-None-Match matched the ETag)"}
}
_atlases: LRUCache[str, Any] = LRUCache(maxsize=ATLAS_CACHE_SIZE)
_atlases_lock = threading.Lock()


def _atlas(cmp: Comparison) -> Any:
    assert cmp.result is not None
    return Atlas.from_dict(cmp.result)


def _cached_atlas(services: Svc, cmp: Comparison) -> Any:
    """The decoded atlas of a finished comparison, from the LRU keyed by its result's sha256."""
    key = cmp.result_sha256
    assert key is not None
    with _atlases_lock:
        atlas = _atlases.get(key)
    if atlas is None:  # decoded outside the lock: a large atlas takes a while
        atlas = _atlas(_finished(services, cmp.id))
        with _atlases_lock:
            _atlases[key] = atlas
    return atlas


def _cached_cells(services: Svc, cmp: Comparison) -> Cells:
    """The per-cell quantities of a finished comparison, from the same LRU as the atlas."""
    key = f"cells:{cmp.result_sha256}"
    with _atlases_lock:
        cells = _atlases.get(key)
    if cells is None:
        result = _finished(services, cmp.id).result
        assert result is not None
        cells = Cells(result)
        with _atlases_lock:
            _atlases[key] = cells
    return cells


def _not_modified(request: Request, etag: str) -> bool:
    inm = request.headers.get("if-none-match", "")
    return etag in [t.strip() for t in inm.split(",")] or inm.strip() == "*"


def _cache_headers(services: Svc, etag: str) -> dict[str, str]:
    # Revalidate every time (the ETag makes that cheap). "private" when reads need a token,
    # so that a shared cache never keeps a copy of a response that needed authorisation.
    settings = services.settings
    scope = "private" if settings.read_requires_token else "public"
    return {"ETag": etag, "Cache-Control": f"{scope}, max-age=0, must-revalidate"}


def _finished(services: Svc, comparison_id: int, *, load_result: bool = True) -> Comparison:
    """The comparison row if it has a result (404/409 otherwise).

    ``load_result=False`` leaves the (large) ``result`` column unloaded; ``result_sha256``,
    which is written in the same transaction, tells whether there is one.
    """
    options = [] if load_result else [defer(Comparison.result)]
    with services.db.session(readonly=True) as s:
        cmp = row_or_404(s, Comparison, comparison_id, options=options)
        if (cmp.result if load_result else cmp.result_sha256) is None:
            raise not_finished("comparison", comparison_id, cmp.job.status, "result")
        return cmp


@router.get("/{comparison_id}/result", **READ)
def get_result(services: Svc, comparison_id: ComparisonId) -> dict[str, Any]:
    """The whole atlas as stored (``analysis.Atlas.to_dict``, with ``baselines`` when asked
    for), its diagnostics and provenance, and the K×K model-level ``summary`` (per model pair:
    mean diagonal CKA, or mean best match where depths differ, with the averaged interval,
    the largest p-value and the baselines)."""
    cmp = _finished(services, comparison_id)
    return {
        "comparison_id": cmp.id,
        "atlas": cmp.result,
        "summary": _cached_cells(services, cmp).summaries(),
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


@router.get(
    "/{comparison_id}/matrix",
    response_model=MatrixOut,
    responses=NOT_MODIFIED,
    **READ,
)
def get_matrix(
    services: Svc,
    request: Request,
    response: Response,
    comparison_id: ComparisonId,
    a: str | None = Query(None, max_length=220, description="Model label or id (default: first)"),
    b: str | None = Query(None, max_length=220, description="Model label or id (default: a)"),
    measure: str = Query(
        "cka",
        max_length=40,
        description="Which measure `values` holds: `cka`, or one the comparison computed "
        "(its option `measures`; docs/measures.md)",
    ),
) -> dict[str, Any] | Response:
    """CKA (or ``measure``) between every layer of model ``a`` (rows) and every layer of model
    ``b`` (columns).

    With the CKA cells' company when the comparison computed it: the 95 % interval
    (``ci_low``, ``ci_high``), the null (``p_value``, its Benjamini–Hochberg ``q_value`` over
    the comparison's cells, ``p_method``: what each p rests on, ``null_mean``, ``null_q95``),
    the top-component ``sensitivity``,
    the ``baselines`` and each cell's ``verdicts`` against them (``verdict_images``: per question,
    whether the image part of the difference's variance is ``paired`` or ``summed``); each null
    when not computed,
    and for any other measure (they are CKA's). ``cca_degenerate`` with the CCA family;
    ``flags``: per flag of ``measure`` (docs/measures.md, "Flags"), where it is raised.
    """
    cmp = _finished(services, comparison_id, load_result=False)
    la = _pick(cmp, a, "a") if a is not None else cmp.members[0].label
    lb = _pick(cmp, b, "b") if b is not None else la
    key = hashlib.sha256(f"matrix-v8:{cmp.result_sha256}:{la}:{lb}:{measure}".encode()).hexdigest()
    headers = _cache_headers(services, f'"{key}"')
    if _not_modified(request, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    cells = _cached_cells(services, cmp)
    _check_measure(cells, measure)
    response.headers.update(headers)
    blocks = cells.blocks_json(la, lb)
    if measure != "cka":
        blocks = dict.fromkeys(blocks, None) | {"cka": cells.measure_json(measure, la, lb)}
    flags = cells.degenerate_block(la, lb)
    names = ("random_init", "random_init_sd", "seed_ceiling")
    baselines = {k: blocks[k] for k in names if blocks[k] is not None}
    verdicts = {k: blocks[k] for k in VERDICT_KEYS if blocks[k] is not None}
    return {
        "comparison_id": cmp.id,
        "a": la,
        "b": lb,
        "rows": list(cells.layers[la]),
        "cols": list(cells.layers[lb]),
        "measure": measure,
        "measures": cells.measure_names,
        "values": blocks["cka"],
        "cca_degenerate": None if flags is None else flags.tolist(),
        "flags": cells.flags_json(measure, la, lb),
        **{
            k: blocks[k]
            for k in (
                "ci_low",
                "ci_high",
                "p_value",
                "q_value",
                "p_method",
                "null_mean",
                "null_q95",
            )
        },
        "sensitivity": blocks["sensitivity"],
        "baselines": baselines or None,
        "undefined_baselines": cells.undefined(la, lb) or None,
        "verdicts": verdicts or None,
        "verdict_images": cells.verdict_images if verdicts else None,
    }


@router.get(
    "/{comparison_id}/heatmap.{fmt}",
    response_class=Response,
    responses={
        200: {"content": {"image/png": {}, "image/svg+xml": {}}},
        **NOT_MODIFIED,
    },
    **READ,
)
def get_heatmap(
    services: Svc,
    request: Request,
    comparison_id: ComparisonId,
    fmt: Literal["png", "svg"],
    colour: Literal["cka", "learned"] = Query(
        "cka",
        description="`cka`: CKA on viridis over [0, 1]; `learned`: CKA minus the untrained "
        "twins' mean, on a diverging scale centred at 0 (needs the `random_init` baseline)",
    ),
    measure: str = Query(
        "cka",
        max_length=40,
        description="The measure drawn (`cka`, or one the comparison computed), named in the "
        "title and colour bar; `colour` `learned` is CKA's alone",
    ),
) -> Response:
    """The atlas heatmap grid, rendered once and cached in the artifact store; has an ETag."""
    cmp = _finished(services, comparison_id, load_result=False)
    if measure != "cka":
        _check_measure(_cached_cells(services, cmp), measure)
        if colour == "learned":
            raise ProblemError(
                422,
                "validation_error",
                f"colour learned is CKA above its untrained twins; measure {measure} has none",
                field="colour",
            )
    if colour == "learned" and not _cached_cells(services, cmp).has("learned"):
        raise ProblemError(
            422,
            "needs_random_init",
            "colour learned needs the random_init baseline and intervals; this comparison has none",
            field="colour",
        )
    return _rendered(
        services,
        request,
        cmp,
        ("heatmap-v1" if colour == "cka" else "heatmap-learned-v1")
        + ("" if measure == "cka" else f"-{measure}-flagged"),  # its flags hatched
        fmt,
        lambda: render_atlas(_cached_atlas(services, cmp), fmt=fmt, colour=colour, measure=measure),
        media_type=MEDIA[fmt],
        ref_kind="heatmap",
    )


@router.get(
    "/{comparison_id}/cells.{fmt}",
    response_class=Response,
    responses={
        200: {"content": {"text/csv": {}, "application/vnd.apache.parquet": {}}},
        **NOT_MODIFIED,
    },
    **READ,
)
def get_cells(
    services: Svc, request: Request, comparison_id: ComparisonId, fmt: Literal["csv", "parquet"]
) -> Response:
    """Every cell as one long table: ``model_a, layer_a, model_b, layer_b, measure, value,
    cca_degenerate`` (one row per cell and measure: ``cka`` and any other the comparison
    computed, its CCA-degenerate flag with the CCA family), then CKA's ``cka, ci_low,
    ci_high, p_value, q_value, null_mean, null_q95, p_method, random_init, random_init_sd,
    seed_ceiling, sensitivity``, ``flags`` (the row's measure's flags raised at the cell, ``;``
    between two: docs/measures.md), then the verdicts ``learned, learned_low, learned_high,
    learned_verdict, seed_gap, seed_gap_low, seed_gap_high, seed_verdict`` (empty/NaN where not
    computed or undefined; ``p_method`` empty too for a comparison stored before it was), one
    row per cell of each model pair (a, b) with a at or before b."""
    cmp = _finished(services, comparison_id, load_result=False)

    def table() -> bytes:
        cells = _cached_cells(services, cmp)
        return cells.to_csv() if fmt == "csv" else cells.to_parquet()

    return _rendered(
        services,
        request,
        cmp,
        "cells-v6",
        fmt,
        table,
        media_type=TABLE_MEDIA[fmt],
        ref_kind="export",
        filename=f"comparison-{comparison_id}-cells.{fmt}",
    )


def _check_measure(cells: Cells, measure: str) -> None:
    """A 422 naming the comparison's measures unless ``measure`` is one of them."""
    if measure not in cells.measure_names:
        raise ProblemError(
            422,
            "unknown_measure",
            f"measure {measure!r} is not one this comparison computed: "
            f"{', '.join(cells.measure_names)}",
            field="measure",
        )


def _rendered(
    services: Svc,
    request: Request,
    cmp: Comparison,
    what: str,
    fmt: str,
    render: Callable[[], bytes],
    *,
    media_type: str,
    ref_kind: str,
    filename: str | None = None,
) -> Response:
    """A ``fmt`` file derived from a finished result (``what``: its kind and version), rendered
    once, kept in the artifact store under a key of the result's sha256, served with an ETag,
    and recorded as the comparison's artifact so that deleting the comparison removes it."""
    key = hashlib.sha256(f"{what}:{cmp.result_sha256}:{fmt}".encode()).hexdigest()
    suffix = f".{fmt}"
    headers = _cache_headers(services, f'"{key}"')
    if _not_modified(request, headers["ETag"]):
        return Response(status_code=304, headers=headers)
    path = services.store.path(key, suffix)
    if path.is_file():
        data = path.read_bytes()
    else:
        data = render()
        services.store.put_as(data, key, suffix)
    gc.add_ref(services.db, services.store, cmp.id, services.store.relative(key, suffix), ref_kind)
    if filename:
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return Response(content=data, media_type=media_type, headers=headers)
