"""Where the engine's batches come from: tensors, arrays, datasets, paths and DataLoaders.

Every form becomes a :class:`BatchSource`: a replayable iterator of raw batches in data
order, the batch count when it is known, and a dataset identity for the Gram store. A raw
batch is a (b, C, H, W) tensor, or, for image files read with ``files=True``, an
:class:`ImageBatch` of decoded images that each model's pipeline turns into its own tensor.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from analysis.datasets import ImageDataset, load_dataset
from analysis.errors import DatasetError
from analysis.images import ImageFiles

__all__ = ["BatchSource", "DataLike", "ImageBatch", "batch_source", "image_files"]

DataLike = (
    torch.Tensor | np.ndarray | ImageDataset | ImageFiles | str | os.PathLike[str] | Iterable[Any]
)


class ImageBatch(list[Image.Image]):
    """Decoded images of one batch; ``shape[0]`` is the batch size, as for a tensor."""

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)


def image_files(data: Any) -> ImageFiles | None:
    """The original files behind ``data`` (an ImageFiles, or an ImageDataset of a folder)."""
    if isinstance(data, ImageFiles):
        return data
    return data.files if isinstance(data, ImageDataset) else None


@dataclass
class BatchSource:
    """Fixed consecutive batches of a dataset, replayable, with the dataset's identity."""

    batches: Callable[[], Iterator[torch.Tensor]]
    total: int | None
    key: str | None  # a dataset identity known without work (sha256 of an ImageDataset, or given)
    array: torch.Tensor | np.ndarray | None = None

    def fingerprint(self) -> str | None:
        """The dataset identity, hashing an in-memory array once when none was given."""
        if self.key is None and self.array is not None:
            a = self.array
            a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
            self.key = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        return self.key


def _batch_tensor(item: Any) -> torch.Tensor:
    if isinstance(item, dict):
        item = next((item[k] for k in ("x", "image", "images", "input") if k in item), None)
    elif isinstance(item, list | tuple) and item:
        item = item[0]
    if isinstance(item, np.ndarray):
        item = torch.from_numpy(np.array(item, dtype=np.float32))
    if not isinstance(item, torch.Tensor):
        raise DatasetError("each batch must be a tensor, or a tuple or dict whose first is one")
    return item


def load_data(data: DataLike) -> Any:
    """A dataset spec or path loaded; anything else as it is."""
    return load_dataset(os.fspath(data)) if isinstance(data, str | os.PathLike) else data


def batch_source(
    data: DataLike, batch_size: int, dataset_key: str | None, *, files: bool = False
) -> BatchSource:
    """Batches of ``data``; with ``files`` the original image files of a folder, decoded."""
    data = load_data(data)
    found = image_files(data)
    if files and found is not None:
        raw = found

        def decoded() -> Iterator[torch.Tensor]:
            for i in range(0, len(raw), batch_size):
                yield ImageBatch(raw.batch(i, i + batch_size))  # type: ignore[misc]

        return BatchSource(decoded, math.ceil(len(raw) / batch_size), dataset_key or raw.sha256)
    if isinstance(data, ImageFiles):
        raise DatasetError(
            f"the images of {data.name} have different sizes; only models with input "
            "pipelines can read them"
        )
    if isinstance(data, ImageDataset):
        dataset_key = dataset_key or data.sha256
        data = data.x
    if isinstance(data, np.ndarray | torch.Tensor):
        arr = data
        if arr.ndim != 4:
            raise DatasetError(f"images must be shaped (N, C, H, W), not {tuple(arr.shape)}")
        n = int(arr.shape[0])

        def batches() -> Iterator[torch.Tensor]:
            for i in range(0, n, batch_size):
                part = arr[i : i + batch_size]
                # a copy per batch: the array may be read-only, and then no view may be shared
                yield part if isinstance(part, torch.Tensor) else torch.from_numpy(np.array(part))

        return BatchSource(batches, math.ceil(n / batch_size), dataset_key, arr)
    if isinstance(data, Iterable):
        loader = data
        total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
        return BatchSource(lambda: (_batch_tensor(i) for i in loader), total, dataset_key)
    raise DatasetError(f"cannot read images from a {type(data).__name__}")
