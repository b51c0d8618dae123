"""``/v1/models``: upload, list, get, download and delete checkpoints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Response, UploadFile, status
from fastapi.responses import FileResponse

from app.http.api.deps import READ, WRITE, Limit, ModelId, Offset, Svc, not_found
from app.http.problems import PROBLEM_RESPONSES, ProblemError
from app.http.schemas import NO_NUL, ModelOut, Page
from app.jobs.train import register_checkpoint
from app.store import repository
from app.store.artifacts import ArtifactStore
from app.store.checkpoints import timm_checkpoint
from app.store.orm import Model

__all__ = ["router"]

router = APIRouter(prefix="/v1/models", tags=["models"], responses=PROBLEM_RESPONSES)


def _save(upload: UploadFile, dest: Path, store: ArtifactStore) -> Path:
    with store.writing(), dest.open("wb") as f:  # a full store is a 507, not a traceback
        shutil.copyfileobj(upload.file, f, 1 << 20)
    return dest


def _config(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: nesting too deep
        raise ProblemError(
            422, "validation_error", "config is not valid JSON", field="config"
        ) from None
    if not isinstance(value, dict):
        raise ProblemError(422, "validation_error", "config must be a JSON object", field="config")
    return value


@router.post(
    "",
    response_model=ModelOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ModelOut, "description": "Already registered (same sha256)"}},
    **WRITE,
)
def upload_model(
    services: Svc,
    response: Response,
    weights: Annotated[UploadFile, File(description="safetensors weights")],
    sidecar: Annotated[UploadFile | None, File(description="JSON sidecar from models.save")] = None,
    timm_name: Annotated[
        str | None, Form(max_length=200, description="timm model name"), NO_NUL
    ] = None,
    config: Annotated[
        str | None,
        Form(max_length=10_000, description='timm kwargs as JSON, e.g. {"num_classes": 10}'),
    ] = None,
    name: Annotated[str | None, Form(max_length=200), NO_NUL] = None,
) -> Model:
    """Register a checkpoint: safetensors weights with their sidecar, or a timm name + weights.

    The weights must load strictly into the declared architecture. Uploading the same weights
    again returns the existing model with 200.
    """
    if (sidecar is None) == (timm_name is None):
        raise ProblemError(
            422, "validation_error", "send exactly one of sidecar or timm_name", field="sidecar"
        )

    with services.store.scratch() as tmp:
        w = _save(weights, Path(tmp) / "weights.safetensors", services.store)
        if sidecar is not None:
            side = _save(sidecar, Path(tmp) / "sidecar.json", services.store)
            row, created = register_checkpoint(services, w, side, name=name, source="upload")
        else:
            assert timm_name is not None
            _sha, _size, _ = timm_checkpoint(services.store, timm_name, w, _config(config))
            stored = services.store.path(_sha, ".safetensors")
            row, created = register_checkpoint(
                services, stored, stored.with_suffix(".json"), name=name or timm_name, source="timm"
            )
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/models/{row.id}"
    return row


@router.get("", response_model=Page[ModelOut], **READ)
def list_models(
    services: Svc,
    limit: Limit = 50,
    offset: Offset = 0,
    arch: Annotated[str | None, Query(max_length=200), NO_NUL] = None,
    source: Annotated[str | None, Query(max_length=20), NO_NUL] = None,
    q: Annotated[
        str | None, Query(max_length=200, description="Substring of the name"), NO_NUL
    ] = None,
    family: Annotated[
        str | None,
        Query(max_length=40, description="mixer, rp_mixer, sw_mlp, mlp, gmlp, timm"),
        NO_NUL,
    ] = None,
    omega_min: Annotated[int | None, Query(ge=0, le=2**62, description="Ω at least")] = None,
    omega_max: Annotated[int | None, Query(ge=0, le=2**62, description="Ω at most")] = None,
    density_min: Annotated[float | None, Query(ge=0, le=1, description="p at least")] = None,
    density_max: Annotated[float | None, Query(ge=0, le=1, description="p at most")] = None,
    training_key: Annotated[
        str | None, Query(pattern="^[0-9a-f]{64}$", description="A training's key")
    ] = None,
) -> dict[str, Any]:
    """Newest last; filter by architecture, family, Ω or density range, or training key."""
    with services.db.session(readonly=True) as s:
        items, total = repository.list_models(
            s,
            limit=limit,
            offset=offset,
            arch=arch,
            q=q,
            source=source,
            family=family,
            omega_min=omega_min,
            omega_max=omega_max,
            density_min=density_min,
            density_max=density_max,
            training_key=training_key,
        )
    return {"items": items, "total": total, "limit": limit, "offset": offset}


def _get(services: Svc, model_id: int) -> Model:
    with services.db.session(readonly=True) as s:
        row = s.get(Model, model_id)
    if row is None:
        raise not_found("model", model_id)
    return row


@router.get("/{model_id}", response_model=ModelOut, **READ)
def get_model(services: Svc, model_id: ModelId) -> Model:
    return _get(services, model_id)


@router.get(
    "/{model_id}/weights",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
    **READ,
)
def download_weights(services: Svc, model_id: ModelId) -> FileResponse:
    row = _get(services, model_id)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", row.name)[:100] or "model"
    return FileResponse(
        services.store.path(row.sha256, ".safetensors"),
        media_type="application/octet-stream",
        filename=f"{safe}.safetensors",
    )


@router.get("/{model_id}/sidecar", **READ)
def download_sidecar(services: Svc, model_id: ModelId) -> dict[str, Any]:
    return _get(services, model_id).sidecar


@router.delete("/{model_id}", status_code=status.HTTP_204_NO_CONTENT, **WRITE)
def delete_model(
    services: Svc,
    model_id: ModelId,
    force: bool = Query(False, description="Also delete the comparisons that use it"),
) -> Response:
    with services.db.session() as s:
        row = s.get(Model, model_id)
        if row is None:
            raise not_found("model", model_id)
        used = repository.comparisons_using_model(s, model_id)
        if used and not force:
            raise ProblemError(
                409,
                "model_in_use",
                f"model {model_id} is used by comparisons {used[:20]}; pass force=true to "
                "delete them too",
                field="force",
            )
        for cid in used:
            repository.delete_comparison(s, cid)
        sha = row.sha256
        s.delete(row)
    services.store.delete(sha, ".safetensors")
    services.store.delete(sha, ".json")
    return Response(status_code=204)
