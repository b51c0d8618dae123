"""``/v1/datasets``: the built-in digits and uploaded ``.npz`` / ImageFolder zips."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import File, Form, Query, Response, UploadFile, status

from analysis import DatasetError
from app.http.api.deps import DatasetId, Force, Paging, Svc, api_router
from app.http.api.rows import listing, row_or_404, view_of
from app.http.api.uploads import answer_registered, register_route, save_upload
from app.http.problems import ProblemError
from app.http.schemas import NO_NUL, DatasetOut, Page
from app.http.security import ADMIN, READ
from app.store import gc, repository
from app.store.datasets import register_dataset_file
from app.store.orm import Dataset

__all__ = ["router"]

router = api_router("datasets")


@router.post("", **register_route(DatasetOut, "Already registered (same content)"))
def upload_dataset(
    services: Svc,
    response: Response,
    file: Annotated[UploadFile, File(description=".npz (x, optional y) or .zip ImageFolder")],
    name: Annotated[str | None, Form(max_length=200), NO_NUL] = None,
) -> Dataset:
    """Register a dataset. The same images (by content hash) return the existing one, 200."""
    with services.store.scratch() as tmp:
        path = save_upload(file, Path(tmp) / "upload.bin", services.store)
        try:
            row, created = register_dataset_file(services, path, filename=file.filename, name=name)
        except DatasetError as exc:  # what is wrong with the file, in one sentence
            raise ProblemError(422, exc.code, str(exc), field="file") from None
    answer_registered(response, f"/v1/datasets/{row.id}", created)
    return row


@router.get("", response_model=Page[DatasetOut], **READ)
def list_datasets(
    services: Svc,
    at: Paging,
    q: Annotated[
        str | None, Query(max_length=200, description="Substring of the name"), NO_NUL
    ] = None,
) -> dict[str, Any]:
    return listing(services, at, repository.list_datasets, q=q)


@router.get("/{dataset_id}", response_model=DatasetOut, **READ)
def get_dataset(services: Svc, dataset_id: DatasetId) -> Dataset:
    return view_of(services, Dataset, dataset_id, lambda _s, row: row)


@router.delete("/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT, **ADMIN)
def delete_dataset(services: Svc, dataset_id: DatasetId, force: Force = False) -> Response:
    with services.db.session() as s:
        row = row_or_404(s, Dataset, dataset_id, with_for_update=True)  # as delete_model
        file_sha, suffix = row.file_sha256, row.file_suffix or ""
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
        paths = gc.delete_comparisons(s, used)
        repository.delete_trainings_of_dataset(s, dataset_id)
        s.delete(row)
    if file_sha:
        services.store.delete(file_sha, suffix)
    gc.release(services.db, services.store, paths)  # Grams, blocks, heatmaps if unshared
    return Response(status_code=204)
