"""Image files decoded once per pipeline, in parallel, and kept where a caller says.

A comparison over image files (:class:`analysis.data.images.ImageFiles`) feeds every model
its own input: each file is decoded, converted to the model's channels, resized and cropped
by the model's pipeline, then normalised. All but the last step depend only on the files and
the pipeline's resize and crop, so models that share those share them (whatever their mean and
std: :attr:`ModelInput.pixel_key`), and a :class:`DecodedCache` keeps
their result — the dataset's (N, C, H, W) uint8 pixels, keyed by the files' content hash and
the pipeline (:func:`decoded_key`) — for the next comparison of the same files through the
same pipeline, which then decodes nothing. :class:`DirectoryDecodedCache` keeps them as
``.npy`` files under a directory and reads them memory-mapped; the service keeps them under
its data directory and collects them as it collects stored Grams.

Decoding runs on a pool of threads (Pillow releases the GIL while it decodes and resizes),
as many as the calling thread's torch intra-op threads (:func:`decode_threads`): the library
sets no thread count, and a worker sizes torch's per job by its CPU rule, so decoding uses
the cores that job may use. Without a cache, each batch's files are decoded once (shared by
every pipeline) and each pipeline's pixels made, on the same pool, batch by batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np
import torch
from PIL import Image

from analysis.data.gpu_jpeg import JpegDecoder, is_jpeg
from analysis.data.images import ImageFiles

__all__ = [
    "DecodedCache",
    "DecodedImages",
    "DirectoryDecodedCache",
    "decode_threads",
    "decoded_key",
    "parallel_map",
]

_KEY_VERSION = "cka-atlas-decoded-v1"
Pixels = Callable[[Image.Image], np.ndarray]  # one image -> its (C, H, W) uint8 pixels
T = TypeVar("T")
R = TypeVar("R")


@runtime_checkable
class DecodedCache(Protocol):
    """Where decoded datasets are kept: uint8 (N, C, H, W) arrays under hex-digest keys."""

    def get(self, key: str) -> np.ndarray | None:
        """The array stored under ``key`` (memory-mapped where the store allows), or None."""
        ...

    def put(self, key: str, pixels: np.ndarray) -> None:
        """Store ``pixels`` under ``key`` (overwriting is harmless: same key, same value)."""
        ...


def decoded_key(files_sha256: str, pipeline: str, shape: Sequence[int]) -> str:
    """The key of a dataset's pixels through one pipeline: the files' content hash, the
    pipeline's identity (:attr:`ModelInput.key`) and the pixels' (C, H, W)."""
    blob = json.dumps(
        {"v": _KEY_VERSION, "files": files_sha256, "pipeline": pipeline, "shape": list(shape)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def decode_threads() -> int:
    """Threads that decode for the calling thread: its torch intra-op count, which a worker
    sets per job from its CPU rule (``CKA_CPU_THREADS``, else its share of the idle CPUs)."""
    return max(torch.get_num_threads(), 1)


def parallel_map(fn: Callable[[T], R], items: Sequence[T], threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, in order, on a pool of :func:`decode_threads` threads
    (or ``threads``); in the calling thread when one is enough."""
    workers = min(threads or decode_threads(), len(items))
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="decode") as pool:
        return list(pool.map(fn, items))


class DirectoryDecodedCache:
    """A :class:`DecodedCache` of ``.npy`` files ``root/ab/abcd….npy``, read memory-mapped.

    Keys must be hex digests (as :func:`decoded_key` makes), so no caller text becomes a path.
    Writes go to a temporary file renamed into place: readers never see half a file.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        """Where ``key`` is kept (it may not exist)."""
        if len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"decoded-image keys are lowercase hex digests, not {key!r}")
        return self.root / key[:2] / f"{key}.npy"

    def get(self, key: str) -> np.ndarray | None:
        path = self.path(key)
        if not path.is_file():
            return None
        found: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
        return found

    def put(self, key: str, pixels: np.ndarray) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, np.ascontiguousarray(pixels, dtype=np.uint8), allow_pickle=False)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class DecodedImages:
    """The pixels of one set of image files through each pipeline a comparison uses.

    With a ``cache``, a pipeline's first batch finds the whole dataset's pixels there, or
    decodes them all (in parallel) and stores them; every later batch is a slice of that
    array. Without one, a batch's files are decoded once for every pipeline and each
    pipeline's pixels made from them (:meth:`batch`). ``threads``: the pool's size (default
    :func:`decode_threads`, looked up in the thread that decodes). ``jpeg``: a decoder of JPEG
    files on a GPU (:func:`analysis.data.gpu_jpeg.jpeg_decoder`) that fills the cache in its
    place for the JPEG files, under keys of its own.
    """

    JPEG_CHUNK = 64  # JPEG files the GPU decodes at once

    def __init__(
        self,
        files: ImageFiles,
        cache: DecodedCache | None = None,
        threads: int | None = None,
        jpeg: JpegDecoder | None = None,
    ) -> None:
        self.files, self.cache, self.threads, self.jpeg = files, cache, threads, jpeg
        self._arrays: dict[str, np.ndarray] = {}
        self.decoded = 0  # images decoded by this object (a cache hit decodes none)

    def images(self, start: int, stop: int) -> list[Image.Image]:
        """The files ``start … stop - 1`` decoded, in parallel."""
        stop = min(stop, len(self.files))
        found = parallel_map(self.files.image, range(start, stop), self.threads)
        self.decoded += len(found)
        return found

    def dataset(self, key: str, shape: Sequence[int], pixels: Pixels) -> np.ndarray:
        """Every file through one pipeline (``key``, made by ``pixels`` as ``shape``): from the
        cache, else decoded now and stored."""
        if key in self._arrays:
            return self._arrays[key]
        assert self.cache is not None
        pipeline = key if self.jpeg is None else f"{key}|nvjpeg"
        name = decoded_key(self.files.sha256, pipeline, shape)
        found = self.cache.get(name)
        want = (len(self.files), *shape)
        if found is None or tuple(found.shape) != want or found.dtype != np.uint8:
            made = np.empty(want, np.uint8)
            on_gpu = (
                []
                if self.jpeg is None
                else [i for i, blob in enumerate(self.files.blobs) if is_jpeg(blob)]
            )
            for at in range(0, len(on_gpu), self.JPEG_CHUNK):
                chunk = on_gpu[at : at + self.JPEG_CHUNK]
                assert self.jpeg is not None
                images = self.jpeg([self.files.blobs[i] for i in chunk])
                for i, row in zip(chunk, parallel_map(pixels, images, self.threads), strict=True):
                    made[i] = row
            done = set(on_gpu)

            def one(i: int) -> None:
                made[i] = pixels(self.files.image(i))

            parallel_map(one, [i for i in range(len(self.files)) if i not in done], self.threads)
            self.decoded += len(self.files)
            self.cache.put(name, made)
            found = self.cache.get(name)
            if found is None or tuple(found.shape) != want:  # a store that keeps nothing
                found = made
        self._arrays[key] = found
        return found

    def batch(
        self,
        key: str,
        shape: Sequence[int],
        pixels: Pixels,
        start: int,
        stop: int,
        images: Callable[[], Sequence[Image.Image]],
    ) -> torch.Tensor:
        """The uint8 (b, C, H, W) pixels of files ``start … stop - 1`` through one pipeline;
        ``images()`` gives the batch's decoded files when there is no cache."""
        if self.cache is not None:
            part = self.dataset(key, shape, pixels)[start:stop]
            return torch.from_numpy(np.array(part))  # a copy: the map is read-only
        return torch.from_numpy(np.stack(parallel_map(pixels, images(), self.threads)))
