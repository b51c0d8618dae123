"""Builders of hostile and malformed request payloads, and the problem+json assertion.

Shared by the API tests: each builder returns the bytes a client would send, so a test reads
as "this file, to that endpoint, gives that problem".
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import save

PROBLEM = "application/problem+json"
PROBLEM_KEYS = {"type", "title", "status", "detail", "code", "field"}


def assert_problem(r: Any, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    """``r`` is an RFC 9457 problem with this status and code (and field, when given)."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM, r.headers["content-type"]
    body: dict[str, Any] = r.json()
    assert set(body) >= PROBLEM_KEYS
    assert body["status"] == status and body["code"] == code, body
    if field is not None:
        assert body["field"] == field, body
    return body


def npy_bytes(shape: tuple[int, ...], data: bytes, dtype: str = "|u1") -> bytes:
    """A .npy member whose header declares ``shape`` whatever ``data`` holds."""
    buffer = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


def safetensors_bytes(header: dict[str, Any], body: bytes, *, declared: int | None = None) -> bytes:
    """A safetensors file with ``header``; ``declared`` overrides the header length field."""
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if declared is None else declared) + raw + body


def checkpoint_files(state: dict[str, Any], sidecar: Path) -> dict[str, tuple[str, bytes]]:
    """Multipart files for ``state`` with ``sidecar``'s metadata, re-signed for these weights.

    The sidecar records the sha256 of the new weights, so the upload gets past the sha256
    check to the question under test (do these weights fit the architecture?).
    """
    weights = save(state, metadata={"format": "cka-atlas-checkpoint"})
    meta = json.loads(sidecar.read_text()) | {"weights_sha256": hashlib.sha256(weights).hexdigest()}
    return {
        "weights": ("w.safetensors", weights),
        "sidecar": ("s.json", json.dumps(meta).encode()),
    }


class WritesMarker:
    """Unpickling this object opens (creates) ``path``: proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}
