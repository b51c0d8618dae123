"""``/v1/datasets``: the built-in digits and uploaded ``.npz`` / ImageFolder zips."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Response, UploadFile, status

from analysis import DatasetError
from app.http.api.deps import ADMIN, READ, WRITE, DatasetId, Limit, Offset, Svc, not_found
from app.http.problems import PROBLEM_RESPONSES, ProblemError
from app.http.schemas import NO_NUL, DatasetOut, Page
from app.store import gc, repository
from app.store.datasets import register_dataset_file
from app.store.orm import Dataset

__all__ = ["router"]

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=PROBLEM_RESPONSES)


@router.post(
    "",
    response_model=DatasetOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": DatasetOut, "description": "Already registered (same content)"}},
    **WRITE,
)
def upload_dataset(
    services: Svc,
    response: Response,
    file: Annotated[UploadFile, File(description=".npz (x, optional y) or .zip ImageFolder")],
    name: Annotated[str | None, Form(max_length=200), NO_NUL] = None,
) -> Dataset:
    """Register a dataset. The same images (by content hash) return the existing one, 200."""
    with services.store.scratch() as tmp:
        path = Path(tmp) / "upload.bin"
        with services.store.writing(), path.open("wb") as f:  # a full store: 507, not 500
            shutil.copyfileobj(file.file, f, 1 << 20)
        try:
            row, created = register_dataset_file(services, path, filename=file.filename, name=name)
        except DatasetError as exc:  # what is wrong with the file, in one sentence
            raise ProblemError(422, "invalid_dataset", str(exc), field="file") from None
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/datasets/{row.id}"
    return row


@router.get("", response_model=Page[DatasetOut], **READ)
def list_datasets(
    services: Svc,
    limit: Limit = 50,
    offset: Offset = 0,
    q: Annotated[
        str | None, Query(max_length=200, description="Substring of the name"), NO_NUL
    ] = None,
) -> dict[str, Any]:
    with services.db.session(readonly=True) as s:
        items, total = repository.list_datasets(s, limit=limit, offset=offset, q=q)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@router.get("/{dataset_id}", response_model=DatasetOut, **READ)
def get_dataset(services: Svc, dataset_id: DatasetId) -> Dataset:
    with services.db.session(readonly=True) as s:
        row = s.get(Dataset, dataset_id)
    if row is None:
        raise not_found("dataset", dataset_id)
    return row


@router.delete("/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT, **ADMIN)
def delete_dataset(
    services: Svc,
    dataset_id: DatasetId,
    force: bool = Query(False, description="Also delete the comparisons over it"),
) -> Response:
    with services.db.session() as s:
        row = s.get(Dataset, dataset_id)
        if row is None:
            raise not_found("dataset", dataset_id)
        if row.builtin:
            raise ProblemError(409, "builtin_dataset", f"dataset {row.name} is built in")
        used = repository.comparisons_using_dataset(s, dataset_id)
        if (used or repository.trainings_using_dataset(s, dataset_id)) and not force:
            raise ProblemError(
                409,
                "dataset_in_use",
                f"dataset {dataset_id} is used by comparisons {used[:20]} or trainings; pass "
                "force=true to delete them too",
                field="force",
            )
        paths = gc.referenced_by(s, used)
        for cid in used:
            repository.delete_comparison(s, cid)
        repository.delete_trainings_of_dataset(s, dataset_id)
        file_sha, suffix = row.file_sha256, row.file_suffix or ""
        s.delete(row)
    if file_sha:
        services.store.delete(file_sha, suffix)
    gc.release(services.db, services.store, paths)  # Grams, blocks, heatmaps if unshared
    return Response(status_code=204)
