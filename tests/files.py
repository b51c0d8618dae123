"""The files tests feed in, as bytes or on disk: .npz and PNG payloads, zip archives, a slice of
the built-in digits, untrained checkpoints of several seeds.

Library only (numpy, Pillow, :mod:`analysis`, :mod:`models`): the library tests use it as well as
the service tests.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import analysis
import models


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def zip_bytes(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for info, payload in entries:
            zf.writestr(info, payload)
    return buffer.getvalue()


def digits_npz(directory: Path, n: int) -> Path:
    """The first ``n`` built-in digits (images and labels) as ``directory/digits{n}.npz``."""
    data = analysis.load_dataset("digits")
    path = directory / f"digits{n}.npz"
    path.write_bytes(npz_bytes(x=data.x[:n], y=data.y[:n]))
    return path


def seed_checkpoints(
    directory: Path, arch: str, seeds: Iterable[int], stem: str = "s{}"
) -> dict[int, Path]:
    """Untrained ``arch`` checkpoints, one per seed (``stem`` names each file by its seed):
    seed siblings of one another."""
    return {
        s: models.save(
            models.create(arch, seed=s), directory / f"{stem.format(s)}.safetensors", seed=s
        )
        for s in seeds
    }
