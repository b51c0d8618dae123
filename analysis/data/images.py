"""Image files kept as they were uploaded, so that each model can read them its own way.

An ImageFolder (directory or zip) may hold JPEG/PNG/WebP files of any sizes and modes
(grayscale, RGBA, palette). :class:`ImageFiles` keeps every file's original bytes in a fixed
order (sorted by path) with its label, if the files came in class folders; a comparison
decodes them per batch and passes each image through each model's own pipeline
(:mod:`analysis.data.preprocessing`). Its ``sha256`` hashes the files' bytes and labels in
that order, so it names exactly these images.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from analysis.errors import DatasetError

__all__ = ["ImageFiles", "files_sha256", "open_image", "peek_image", "reason", "thumbnail"]

_HASH_VERSION = b"cka-atlas-image-files-v1"


_DECODE_ERRORS = (
    OSError,
    ValueError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)


def peek_image(data: bytes, where: str = "image", budget: int | None = None) -> Image.Image:
    """One image file's header (size, mode), its pixels not decoded yet.

    ``budget`` bounds the decoded bytes (width × height × bands), checked from the header
    before the pixels are decoded: a small PNG can declare a huge canvas. Pillow's own bomb
    warning is an error too.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            decoded = image.width * image.height * len(image.getbands())
    except _DECODE_ERRORS as exc:
        raise DatasetError(f"'{where}' is not a readable image ({reason(exc)}).") from exc
    if budget is not None and decoded > budget:
        raise DatasetError(
            f"'{where}' is {image.width}×{image.height}: the images decode to more than the "
            "bytes a dataset may hold."
        )
    return image


def open_image(data: bytes, where: str = "image", budget: int | None = None) -> Image.Image:
    """Decode one image file: the one decoder of uploaded images (folders, batches, thumbnails),
    after :func:`peek_image`'s checks."""
    image = peek_image(data, where, budget)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
    except _DECODE_ERRORS as exc:
        raise DatasetError(f"'{where}' is not a readable image ({reason(exc)}).") from exc
    return image


def reason(exc: BaseException) -> str:
    """The first line of an exception's message, to quote inside a sentence."""
    text = str(exc).strip().rstrip(".")
    return text.splitlines()[0] if text else type(exc).__name__


def thumbnail(image: Image.Image, side: int = 96) -> bytes:
    """PNG bytes of ``image`` shrunk (never enlarged) to fit ``side``×``side``, as RGB or L."""
    if image.mode == "P":
        image = image.convert("RGBA")
    small = image.convert("L" if image.mode in ("1", "L", "I", "I;16", "F") else "RGB")
    small.thumbnail((side, side), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def files_sha256(digests: Iterable[bytes], labels: np.ndarray | None) -> str:
    """The content hash of image files: their sha256 digests and labels (if any), in order."""
    digest = hashlib.sha256(_HASH_VERSION)
    if labels is None:
        digest.update(b"no-labels")
        for file_digest in digests:
            digest.update(file_digest)
        return digest.hexdigest()
    for file_digest, label in zip(digests, labels.tolist(), strict=True):
        digest.update(file_digest)
        digest.update(int(label).to_bytes(8, "little", signed=True))
    return digest.hexdigest()


@dataclass(frozen=True, eq=False)
class ImageFiles:
    """Original image files, with labels where they came in class folders: the raw form every
    model's pipeline reads."""

    name: str
    blobs: tuple[bytes, ...]
    paths: tuple[str, ...]
    y: np.ndarray | None
    classes: list[str] | None
    channels: int = 3  # 1 when every image is grayscale
    sizes: tuple[tuple[int, int], ...] = ()
    sha256: str = field(default="")

    def __post_init__(self) -> None:
        labels = len(self.blobs) if self.y is None else len(self.y)
        if not self.blobs or len(self.blobs) != labels or len(self.paths) != len(self.blobs):
            raise DatasetError(f"'{self.name}' needs one path (and one label, if any) per image")
        if not self.sha256:
            digests = (hashlib.sha256(blob).digest() for blob in self.blobs)
            object.__setattr__(self, "sha256", files_sha256(digests, self.y))

    def __len__(self) -> int:
        return len(self.blobs)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) where every image has that size, else (C, 0, 0): the sizes vary."""
        if len(set(self.sizes)) == 1:
            w, h = self.sizes[0]
            return self.channels, h, w
        return self.channels, 0, 0

    @property
    def num_classes(self) -> int | None:
        return None if self.classes is None else len(self.classes)

    def image(self, i: int) -> Image.Image:
        """Image ``i`` decoded, in its own size and mode."""
        return open_image(self.blobs[i], f"{self.name}/{self.paths[i]}")

    def batch(self, start: int, stop: int) -> list[Image.Image]:
        return [self.image(i) for i in range(start, min(stop, len(self)))]
