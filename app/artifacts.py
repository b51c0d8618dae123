"""Content-addressed artifact store under ``CKA_DATA_DIR``.

Blobs live at ``blobs/<sha[:2]>/<sha><suffix>`` where ``sha`` is the sha256 of the content
and ``suffix`` comes from a fixed whitelist: no user-supplied name ever becomes a path.
Writes go to a temporary file in the same filesystem and are renamed into place, so a
reader never sees half a file and a crash leaves at most an orphaned temporary file.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

__all__ = ["SUFFIXES", "ArtifactStore", "TooLarge"]

SUFFIXES = frozenset({"", ".safetensors", ".json", ".npz", ".zip", ".png", ".svg"})
_SHA = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class TooLarge(ValueError):
    """A stream exceeded the size limit while being written to the store."""


class ArtifactStore:
    """Blobs, Gram cache and scratch space under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.grams = self.root / "grams"
        self.tmp = self.root / "tmp"
        for d in (self.blobs, self.grams, self.tmp):
            d.mkdir(parents=True, exist_ok=True)

    def path(self, sha: str, suffix: str = "") -> Path:
        """Where the blob ``sha`` lives (it may not exist)."""
        if not _SHA.match(sha):
            raise ValueError(f"not a sha256 hex digest: {sha!r}")
        if suffix not in SUFFIXES:
            raise ValueError(f"artifact suffix {suffix!r} is not allowed")
        return self.blobs / sha[:2] / f"{sha}{suffix}"

    def exists(self, sha: str, suffix: str = "") -> bool:
        return self.path(sha, suffix).is_file()

    def put_bytes(self, data: bytes, suffix: str = "") -> str:
        """Store ``data``; returns its sha256."""
        return self.put_chunks([data], suffix)[0]

    def put_stream(
        self, stream: BinaryIO, suffix: str = "", limit: int | None = None
    ) -> tuple[str, int]:
        """Store a readable binary stream; returns (sha256, size). Raises TooLarge past limit."""
        return self.put_chunks(iter(lambda: stream.read(_CHUNK), b""), suffix, limit)

    def put_chunks(
        self, chunks: Iterable[bytes], suffix: str = "", limit: int | None = None
    ) -> tuple[str, int]:
        digest = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise TooLarge(f"upload exceeds the limit of {limit} bytes")
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            sha = digest.hexdigest()
            self.place(Path(tmp_name), sha, suffix)
            return sha, size
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def place(self, tmp: Path, sha: str, suffix: str = "") -> Path:
        """Atomically move a finished temporary file into its content address."""
        dest = self.path(sha, suffix)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return dest

    def put_as(self, data: bytes, sha: str, suffix: str) -> Path:
        """Store ``data`` under an address derived from another blob (e.g. a sidecar)."""
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return self.place(Path(tmp_name), sha, suffix)

    def scratch(self) -> tempfile.TemporaryDirectory[str]:
        """A private temporary directory on the store's filesystem, removed on exit."""
        return tempfile.TemporaryDirectory(dir=self.tmp)

    def delete(self, sha: str, suffix: str = "") -> None:
        self.path(sha, suffix).unlink(missing_ok=True)
