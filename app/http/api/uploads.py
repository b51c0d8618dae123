"""How the endpoints that register content take a file and answer: an upload spooled into the
store's scratch space, 201 with the Location of what is new, 200 when it was there already."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fastapi import Response, UploadFile, status
from pydantic import BaseModel

from app.http.security import WRITE
from app.store.artifacts import ArtifactStore

__all__ = ["answer_registered", "register_route", "save_upload"]


def register_route(out: type[BaseModel], again: str) -> dict[str, Any]:
    """``router.post``'s arguments for a register endpoint answering ``out``: 201 when new,
    200 when the same content was registered before (``again`` says how that is told)."""
    return {
        "response_model": out,
        "status_code": status.HTTP_201_CREATED,
        "responses": {200: {"model": out, "description": again}},
        **WRITE,
    }


def save_upload(upload: UploadFile, dest: Path, store: ArtifactStore) -> Path:
    """Copy an upload to ``dest`` (in the store's scratch), from where it is checked and then
    renamed into the store; an upload that cannot fit is a 507 before a byte is written, and
    a store that fills up meanwhile a 507 too, never a 500."""
    if upload.size is not None:
        name = Path(upload.filename or "").name[:100]
        store.check_room(upload.size, f"the upload {name!r}" if name else "the upload")
    with store.writing(), dest.open("wb") as f:
        shutil.copyfileobj(upload.file, f, 1 << 20)
    return dest


def answer_registered(response: Response, location: str, created: bool, new: int = 201) -> None:
    """Status ``new`` (201, or 202 for queued work) when ``created``, else 200; the Location."""
    response.status_code = new if created else 200
    response.headers["Location"] = location
