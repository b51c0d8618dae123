"""Stored per-batch Grams, so a model already run on a dataset and batch plan is not run again.

The engine asks the cache once per (model, batch) before running a model; when every batch of
a model is found, the model never runs. A key is the sha256 of a canonical JSON of everything
the value depends on (see :func:`gram_key`). Two kinds of value are kept: the (L, b, b) stack
of a model's raw, uncentred Grams of one batch (float32, or float64 for a float64 model), and
the float64 (L_a, L_b) HSIC block of one batch between two such stacks. Both are exactly what
the engine would otherwise compute, so a stored run is bit-identical to a fresh one.
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
    """Where the engine keeps Gram stacks and HSIC blocks: arrays under opaque string keys."""

    def get(self, key: str) -> np.ndarray | None:
        """The array stored under ``key``, or None."""
        ...

    def put(self, key: str, grams: np.ndarray) -> None:
        """Store ``grams`` under ``key`` (overwriting is harmless: same key, same value).

        float32 and float64 arrays keep their dtype; any other dtype is stored as float32.
        """
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
            dtype = grams.dtype if grams.dtype in (np.float32, np.float64) else np.float32
            save_file({"grams": np.ascontiguousarray(grams, dtype=dtype)}, tmp)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
