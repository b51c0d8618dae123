"""``/v1/models``: upload, list, get, download and delete checkpoints."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import File, Form, Query, Response, UploadFile, status
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session

from app.http.api.deps import Force, ModelId, Paging, Svc, api_router
from app.http.api.rows import listing, row_or_404, view_of
from app.http.api.uploads import answer_registered, register_route, save_upload
from app.http.problems import ProblemError
from app.http.schemas import NO_NUL, ModelOut, Page
from app.http.security import ADMIN, READ
from app.jobs.submit import skeleton
from app.jobs.train import register_checkpoint
from app.store import gc, repository
from app.store.checkpoints import (
    check_safetensors,
    hub_checkpoint,
    pretrained_checkpoint,
    shown,
    timm_checkpoint,
)
from app.store.orm import Model

__all__ = ["router"]

router = api_router("models")


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
    **register_route(
        ModelOut, "Already registered (same sha256); a new `name` is added to its `aliases`"
    ),
)
def upload_model(
    services: Svc,
    response: Response,
    weights: Annotated[UploadFile | None, File(description="safetensors weights")] = None,
    hub: Annotated[
        UploadFile | None,
        File(
            description="a .zip of a Hugging Face / timm model folder: config.json + "
            "model.safetensors, as timm's save_for_hf(..., safe_serialization=True) writes"
        ),
    ] = None,
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
    """Register a checkpoint: weights with their sidecar, a timm name + weights, or a model folder.

    ``hub`` (a zipped Hugging Face / timm folder) needs nothing else; ``timm_name`` with
    config ``{"pretrained": true}`` takes the published weights from the operator's
    CKA_PRETRAINED_DIR instead of an upload (never a download). The weights must load
    strictly into the declared architecture. The same weights again return the existing
    model with 200; a ``name`` it does not have is added to its ``aliases`` (a model is its
    weights: one row per sha256, so the name is kept rather than dropped or refused).
    """
    if hub is not None:
        if weights is not None or sidecar is not None or timm_name is not None:
            raise ProblemError(
                422, "validation_error", "send hub alone (it holds its own config)", field="hub"
            )
        return _register_hub(services, response, hub, name)
    options = _config(config)
    pretrained = options.get("pretrained") is True and timm_name is not None and weights is None
    if weights is None and not pretrained:
        raise ProblemError(
            422, "validation_error", _no_weights(sidecar, timm_name), field="weights"
        )

    with services.store.scratch() as tmp:
        if pretrained:
            assert timm_name is not None
            if sidecar is not None:
                raise ProblemError(422, "validation_error", _BOTH, field="sidecar")
            sha, _size, _ = pretrained_checkpoint(
                services.store, timm_name, options, services.settings.pretrained_dir
            )
            stored = services.store.path(sha, ".safetensors")
            row, created = register_checkpoint(
                services, stored, stored.with_suffix(".json"), name=name, source="timm"
            )
            return _answer(response, row, created)
        assert weights is not None
        w = save_upload(weights, Path(tmp) / "weights.safetensors", services.store)
        # What is wrong with the file comes first: a pickle sent without its sidecar is
        # told that it is a pickle, not that a sidecar is missing.
        check_safetensors(w, weights.filename)
        if (sidecar is None) == (timm_name is None):
            what = f"the weights {shown(weights.filename, '')}".rstrip()
            raise ProblemError(
                422,
                "validation_error",
                _BOTH
                if sidecar is not None
                else f"{what} need their sidecar (the .json file models.save writes beside "
                "them) or a timm_name (the timm architecture they are a state dict of); a "
                "Hugging Face / timm model folder goes zipped, as hub",
                field="sidecar",
            )
        if sidecar is not None:
            side = save_upload(sidecar, Path(tmp) / "sidecar.json", services.store)
            row, created = register_checkpoint(
                services,
                w,
                side,
                name=name,
                source="upload",
                weights_name=weights.filename,
                sidecar_name=sidecar.filename,
            )
        else:
            assert timm_name is not None
            _sha, _size, _ = timm_checkpoint(
                services.store, timm_name, w, options, weights_name=weights.filename
            )
            stored = services.store.path(_sha, ".safetensors")
            row, created = register_checkpoint(
                services, stored, stored.with_suffix(".json"), name=name, source="timm"
            )
    return _answer(response, row, created)


_BOTH = "send either a sidecar or a timm_name with the weights, not both (the sidecar names the "
_BOTH += "architecture already)"


def _no_weights(sidecar: UploadFile | None, timm_name: str | None) -> str:
    """What a request without weights (and without pretrained weights) lacks, in words."""
    if sidecar is not None:
        return (
            f"{shown(sidecar.filename, 'the sidecar')} came without the weights it describes: "
            "send the .safetensors file as weights"
        )
    if timm_name is not None:
        return (
            f"timm_name {timm_name[:200]!r} needs weights (a .safetensors state dict), or "
            'config {"pretrained": true} for the published weights in CKA_PRETRAINED_DIR'
        )
    return (
        "send a model: weights with their sidecar, weights with a timm_name, or a zipped "
        "Hugging Face / timm model folder as hub"
    )


def _answer(response: Response, row: Model, created: bool) -> Model:
    answer_registered(response, f"/v1/models/{row.id}", created)
    return row


def _register_hub(services: Svc, response: Response, hub: UploadFile, name: str | None) -> Model:
    with services.store.scratch() as tmp:
        archive = save_upload(hub, Path(tmp) / "folder.zip", services.store)
        sha, _size, _ = hub_checkpoint(
            services.store, archive, services.settings.max_upload_bytes * 4, hub.filename
        )
        stored = services.store.path(sha, ".safetensors")
        row, created = register_checkpoint(
            services, stored, stored.with_suffix(".json"), name=name, source="hub"
        )
    return _answer(response, row, created)


@router.get("", response_model=Page[ModelOut], **READ)
def list_models(
    services: Svc,
    at: Paging,
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
    return listing(
        services,
        at,
        repository.list_models,
        _views,
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


def _views(s: Session, items: Sequence[Model]) -> list[dict[str, Any]]:
    """The models' views, each with the bytes its stored artifacts take."""
    sizes = gc.model_artifact_bytes(s, [m.id for m in items])
    return [_view(m, sizes.get(m.id, 0)) for m in items]


def _view(row: Model, artifact_bytes: int) -> dict[str, Any]:
    return ModelOut.model_validate(row).model_dump() | {"artifact_bytes": artifact_bytes}


def _get(services: Svc, model_id: int) -> Model:
    return view_of(services, Model, model_id, lambda _s, row: row)


@router.get("/{model_id}", response_model=ModelOut, **READ)
def get_model(services: Svc, model_id: ModelId) -> dict[str, Any]:
    row = _get(services, model_id)
    with services.db.session(readonly=True) as s:
        size = gc.model_artifact_bytes(s, [model_id]).get(model_id, 0)
    return _view(row, size)


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


@router.get("/{model_id}/layers", **READ)
def model_layers(services: Svc, model_id: ModelId) -> dict[str, Any]:
    """Every layer name a comparison's ``layers`` can select of this model, in module order,
    and its default layers (what ``layers: null`` compares)."""
    from analysis.layers import available_layers

    row = _get(services, model_id)
    return {
        "model_id": row.id,
        "default_layers": list(row.default_layers),
        "layers": available_layers(skeleton(row.arch, row.config)),
    }


@router.get("/{model_id}/sidecar", **READ)
def download_sidecar(services: Svc, model_id: ModelId) -> dict[str, Any]:
    return _get(services, model_id).sidecar


@router.delete("/{model_id}", status_code=status.HTTP_204_NO_CONTENT, **ADMIN)
def delete_model(services: Svc, model_id: ModelId, force: Force = False) -> Response:
    with services.db.session() as s:
        # Locked until the delete commits: a concurrent delete waits here, then finds no
        # row (404) instead of a row deleted under it (PostgreSQL; SQLite's writers queue).
        row = row_or_404(s, Model, model_id, with_for_update=True)
        sha = row.sha256
        used = repository.comparisons_using_model(s, model_id)
        if used and not force:
            raise ProblemError(
                409,
                "model_in_use",
                f"model {model_id} is used by comparisons {used[:20]}; pass force=true to "
                "delete them too",
                field="force",
            )
        paths = gc.delete_comparisons(s, used)
        s.delete(row)
    services.store.delete(sha, ".safetensors")
    services.store.delete(sha, ".json")
    gc.release(services.db, services.store, paths)  # its Grams, blocks, heatmaps if unshared
    return Response(status_code=204)
