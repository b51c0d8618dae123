"""Stored per-batch Grams, so a model already run on a dataset and batch plan is not run again.

The engine asks the cache once per (model, batch) before running a model; when every batch of
a model is found, the model never runs. A key is the sha256 of a canonical JSON of everything
the raw Gram stack depends on (see :func:`gram_key`); the value is the (L, b, b) float32 stack
of raw, uncentred Grams, exactly what the engine would otherwise compute, so results with and
without the cache are bit-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from safetensors.numpy import load_file, save_file

__all__ = ["DirectoryGramCache", "GramCache", "gram_key"]


@runtime_checkable
class GramCache(Protocol):
    """Where the engine keeps Gram stacks: float32 arrays (L, b, b) under opaque string keys."""

    def get(self, key: str) -> np.ndarray | None:
        """The stack stored under ``key``, or None."""
        ...

    def put(self, key: str, grams: np.ndarray) -> None:
        """Store ``grams`` under ``key`` (overwriting is harmless: same key, same value)."""
        ...


def gram_key(**parts: Any) -> str:
    """A stable hex key for a JSON-able description (model key, dataset, batch, layers, ...)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class DirectoryGramCache:
    """A :class:`GramCache` of safetensors files ``root/ab/abcd….safetensors``.

    Keys must be hex digests (as :func:`gram_key` makes), so no caller text becomes a path.
    Writes go to a temporary file that is renamed into place: readers never see half a file.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        if len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"gram cache keys are lowercase hex digests, not {key!r}")
        return self.root / key[:2] / f"{key}.safetensors"

    def get(self, key: str) -> np.ndarray | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return load_file(path)["grams"]

    def put(self, key: str, grams: np.ndarray) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        try:
            save_file({"grams": np.ascontiguousarray(grams, dtype=np.float32)}, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
