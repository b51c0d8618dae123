"""A dataset's labels, and any one of its images, without decoding the others.

What a page that shows a few images of a dataset needs: :func:`peek_dataset` reads how many
images there are, their labels and classes, and :meth:`DatasetPeek.sample` then reads one
image. Nothing holds the dataset's images: an ``.npz`` is read from its headers, its labels
and the one slice of ``x`` that holds the image (streamed to it, a slice at a time); an
ImageFolder from its paths and image headers (:mod:`analysis.data.datasets`' checks, one file
at a time), and then the one file. The built-in digits are small and loaded whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from analysis.data.datasets import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_ARCHIVE_MEMBERS,
    _classes,
    _existing,
    _folder_files,
    _Layout,
    _npz_labels,
    _plan_folder,
    load_digits,
)
from analysis.data.images import open_image
from analysis.data.npz import NpzArchive
from analysis.errors import DatasetError

__all__ = ["DatasetPeek", "Sample", "peek_dataset"]

# One image: the pixels of an array dataset as float32 (C, H, W), or an image file of a
# folder as decoded (its own size and mode).
Sample = np.ndarray | Image.Image


@dataclass(frozen=True)
class DatasetPeek:
    """How many images, their labels (None: unlabelled) and classes, and a reader of one."""

    name: str
    n: int
    labels: np.ndarray | None
    classes: list[str] | None
    _read: Callable[[int], Sample]
    _lock: threading.Lock

    def __len__(self) -> int:
        return self.n

    def sample(self, index: int) -> Sample:
        """Image ``index`` (0 ≤ index < n), read now (one at a time: archives are shared)."""
        if not 0 <= index < self.n:
            raise IndexError(f"{self.name} has {self.n} images; there is no image {index}")
        with self._lock:
            return self._read(index)


def peek_dataset(spec: str | Path, *, split: str = "test") -> DatasetPeek:
    """The peek of ``"digits"`` (``split``), an ``.npz`` file or an ImageFolder (a directory,
    or a ``.zip`` of one), checked as :func:`analysis.data.datasets.load_dataset` checks them."""
    if str(spec) == "digits":
        data = load_digits(split)
        return DatasetPeek(
            data.name,
            len(data),
            data.y,
            data.classes,
            lambda i: data.x[i],
            threading.Lock(),
        )
    path = _existing(spec)
    if path.is_file() and path.suffix.lower() == ".npz":
        return _peek_npz(path)
    files, name, budget = _folder_files(
        path, DEFAULT_MAX_ARCHIVE_BYTES, DEFAULT_MAX_ARCHIVE_MEMBERS
    )
    plan = _plan_folder(files, name, budget, None)

    def read(i: int) -> Sample:
        key = plan.keys[i]
        return open_image(files[key](), f"{name}/{key}")

    return DatasetPeek(name, len(plan.keys), plan.y, plan.classes, read, threading.Lock())


def _peek_npz(path: Path) -> DatasetPeek:
    name = path.name
    with NpzArchive(
        path, name, max_bytes=DEFAULT_MAX_ARCHIVE_BYTES, max_members=DEFAULT_MAX_ARCHIVE_MEMBERS
    ) as archive:
        stored = archive.arrays.get("x")
        if stored is None:
            raise DatasetError(f"'{name}' has no array named 'x'.")
        layout = _Layout.of(stored.shape, stored.dtype, name)
        labels = _npz_labels(archive, name, layout.shape[0])

    def read(i: int) -> Sample:
        with NpzArchive(
            path, name, max_bytes=DEFAULT_MAX_ARCHIVE_BYTES, max_members=DEFAULT_MAX_ARCHIVE_MEMBERS
        ) as archive:
            done = 0
            for raw in archive.slices("x"):  # streamed up to the slice that holds image i
                if i < done + len(raw):
                    image: np.ndarray = layout.convert(raw[i - done : i - done + 1])[0]
                    return image
                done += len(raw)
        raise IndexError(f"{name} ends before image {i}")

    return DatasetPeek(name, layout.shape[0], labels, _classes(labels), read, threading.Lock())
