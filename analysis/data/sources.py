"""Where the engine's batches come from: tensors, arrays, datasets, paths and DataLoaders.

Every form becomes a :class:`BatchSource`: a replayable iterator of raw batches in data
order, the batch count when it is known, and a dataset identity for the Gram store. A source
reads a range of batches as cheaply as its form allows (see :meth:`BatchSource.indexed`). A raw
batch is a (b, C, H, W) tensor, or, for image files read with ``files=True``, an
:class:`ImageBatch` of image files that each model's pipeline turns into its own tensor: from
pixels decoded once per pipeline (:mod:`analysis.data.decoded`, kept in a ``decoded_cache``
when one is given), or decoded for the batch when it is read as images.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from analysis.data.datasets import ImageDataset, array_slices, load_dataset
from analysis.data.decoded import DecodedCache, DecodedImages, Pixels
from analysis.data.gpu_jpeg import JpegDecoder
from analysis.data.images import ImageFiles
from analysis.data.ranges import ValueRange, infer_range
from analysis.errors import DatasetError

__all__ = ["BatchSource", "DataLike", "ImageBatch", "batch_source", "image_files"]

DataLike = (
    torch.Tensor | np.ndarray | ImageDataset | ImageFiles | str | os.PathLike[str] | Iterable[Any]
)


class ImageBatch(Sequence[Image.Image]):
    """The image files ``start … stop - 1`` of one batch, decoded only when read as images
    (in parallel, once); ``shape[0]`` is the batch size, as for a tensor."""

    def __init__(self, decoded: DecodedImages, start: int, stop: int) -> None:
        self.decoded, self.start = decoded, start
        self.stop = min(stop, len(decoded.files))

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @cached_property
    def images(self) -> list[Image.Image]:
        """The batch's files decoded, each in its own size and mode."""
        return self.decoded.images(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: Any) -> Any:
        return self.images[i]

    def __iter__(self) -> Iterator[Image.Image]:
        return iter(self.images)

    def pixels(self, key: str, shape: Sequence[int], pixels: Pixels) -> torch.Tensor:
        """The batch's uint8 (b, C, H, W) pixels through one pipeline (``key``, made by
        ``pixels`` as ``shape``), decoded once per pipeline (:class:`DecodedImages`)."""
        return self.decoded.batch(key, shape, pixels, self.start, self.stop, lambda: self.images)


def image_files(data: Any) -> ImageFiles | None:
    """The original files behind ``data`` (an ImageFiles, or an ImageDataset of a folder)."""
    if isinstance(data, ImageFiles):
        return data
    return data.files if isinstance(data, ImageDataset) else None


@dataclass
class BatchSource:
    """Fixed consecutive batches of a dataset, replayable, with the dataset's identity.

    ``batches(first, stop)`` yields the batches ``first, first + 1, …`` before ``stop`` (None:
    to the end) of the plan.
    """

    batches: Callable[[int, int | None], Iterator[Any]]
    total: int | None
    key: str | None  # a dataset identity known without work (sha256 of an ImageDataset, or given)
    kind: Literal["files", "array", "batches"]  # image files, an array, a DataLoader's batches
    array: torch.Tensor | np.ndarray | None = None
    find_range: Callable[[], ValueRange] | None = None  # an array's, read when first asked

    @property
    def image_shape(self) -> tuple[int, ...] | None:
        """(C, H, W) of an array's images; None for image files and iterables."""
        return None if self.array is None else tuple(int(v) for v in self.array.shape[1:])

    def pixel_range(self) -> ValueRange | None:
        """The values of an array that stand for black and white (:mod:`analysis.data.ranges`),
        found once; None for image files and iterables."""
        if self.find_range is None:
            return None
        found = self.find_range()
        self.find_range = lambda: found
        return found

    def indexed(self, window: range | None = None) -> Iterator[tuple[int, Any]]:
        """(global batch index, raw batch) for the batches in ``window`` (None: all), in order.

        Arrays and tensors are sliced and image files decoded only for the window's batches;
        an iterable (a DataLoader) cannot seek, so the batches before the window are read and
        skipped.
        """
        first, stop = (0, None) if window is None else (window.start, window.stop)
        return enumerate(self.batches(first, stop), first)

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


def _end(n: int, stop: int | None, batch_size: int) -> int:
    """The sample index where batch ``stop`` begins (the end of the data for None)."""
    return n if stop is None else min(n, stop * batch_size)


def load_data(data: DataLike) -> Any:
    """A dataset spec or path loaded; anything else as it is."""
    return load_dataset(os.fspath(data)) if isinstance(data, str | os.PathLike) else data


def batch_source(
    data: DataLike,
    batch_size: int,
    dataset_key: str | None,
    *,
    files: bool = False,
    decoded_cache: DecodedCache | None = None,
    jpeg: JpegDecoder | None = None,
) -> BatchSource:
    """Batches of ``data``; with ``files`` the original image files of a folder, each
    pipeline's pixels decoded once (kept in ``decoded_cache`` when given, its JPEG files
    decoded by ``jpeg`` there: :mod:`analysis.data.gpu_jpeg`)."""
    data = load_data(data)
    found = image_files(data)
    if files and found is not None:
        raw = found
        pixels = DecodedImages(raw, decoded_cache, jpeg=jpeg if decoded_cache else None)

        def decoded(first: int, stop: int | None) -> Iterator[ImageBatch]:
            for i in range(first * batch_size, _end(len(raw), stop, batch_size), batch_size):
                yield ImageBatch(pixels, i, i + batch_size)

        return BatchSource(
            decoded, math.ceil(len(raw) / batch_size), dataset_key or raw.sha256, "files"
        )
    if isinstance(data, ImageFiles):
        raise DatasetError(
            f"the images of {data.name} have different sizes; only models with input "
            "pipelines can read them"
        )
    find_range = None
    if isinstance(data, ImageDataset):
        dataset_key = dataset_key or data.sha256
        find_range = data.pixel_range
        data = data.x
    if isinstance(data, np.ndarray | torch.Tensor):
        arr = data
        if arr.ndim != 4:
            raise DatasetError(f"images must be shaped (N, C, H, W), not {tuple(arr.shape)}")
        n = int(arr.shape[0])
        find_range = find_range or (lambda: infer_range(array_slices(arr)))

        def batches(first: int, stop: int | None) -> Iterator[torch.Tensor]:
            for i in range(first * batch_size, _end(n, stop, batch_size), batch_size):
                part = arr[i : i + batch_size]
                # a copy per batch: the array may be read-only, and then no view may be shared
                yield part if isinstance(part, torch.Tensor) else torch.from_numpy(np.array(part))

        return BatchSource(
            batches, math.ceil(n / batch_size), dataset_key, "array", arr, find_range
        )
    if isinstance(data, Iterable):
        loader = data
        total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]

        def read(first: int, stop: int | None) -> Iterator[torch.Tensor]:
            return (_batch_tensor(b) for b in itertools.islice(loader, first, stop))

        return BatchSource(read, total, dataset_key, "batches")
    raise DatasetError(f"cannot read images from a {type(data).__name__}")
