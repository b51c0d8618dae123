"""Image datasets: the built-in digits, ``.npz`` arrays and ImageFolder trees or archives.

Every source becomes the same :class:`ImageDataset`: float32 images shaped (N, C, H, W), optional
int64 labels and a content sha256 that depends only on those arrays, so the same images give
the same hash whatever file they came from. Nothing is ever unpickled: ``.npz`` files are read
with ``allow_pickle=False`` and archives are read in memory, never extracted to disk.
"""

from __future__ import annotations

import hashlib
import io
import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np
import torch
from PIL import Image

from analysis.errors import DatasetError
from analysis.images import ImageFiles, open_image, reason
from models.archives import ArchiveError, open_zip, read_entry, safe_entries

__all__ = [
    "DIGITS_SPLITS",
    "IMAGE_SUFFIXES",
    "ImageDataset",
    "load_dataset",
    "load_digits",
    "load_image_folder",
    "load_npz",
    "training_data",
]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
DIGITS_SPLITS = ("train", "test", "all")

# The digits split is fixed once and for all so that every checkpoint's test accuracy and every
# comparison over "digits:test" refers to the same 450 images: a quarter of the 1797, stratified
# by class, drawn with seed 0.
_DIGITS_TEST_FRACTION = 0.25
_DIGITS_SEED = 0
# Pixel values of scikit-learn's digits are counts of set pixels in 4×4 cells: 0..16.
_DIGITS_MAX = 16.0

# Archive limits: beyond these an upload is treated as hostile rather than read.
DEFAULT_MAX_ARCHIVE_BYTES = 1 << 30
DEFAULT_MAX_ARCHIVE_MEMBERS = 200_000
# (Compression bombs, zip slip and links: models.archives, shared with model folders.)
_HASH_VERSION = b"cka-atlas-dataset-v1"


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """Images as float32 (N, C, H, W), labels if known, and a stable content hash.

    ``x`` holds values in [0, 1] for integer sources; float sources keep their values.
    ``sha256`` hashes the arrays themselves, so re-encoding a dataset does not change it.
    """

    name: str
    x: np.ndarray
    y: np.ndarray | None = None
    classes: list[str] | None = None
    sha256: str = field(default="")
    files: ImageFiles | None = None  # the original files of an ImageFolder, for pipelines

    def __post_init__(self) -> None:
        _check_images(self.x, self.name)
        if self.y is not None:
            _check_labels(self.y, len(self.x), self.name)
        if not self.sha256:
            object.__setattr__(self, "sha256", content_sha256(self.x, self.y))

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """Shape of one image, (C, H, W)."""
        c, h, w = self.x.shape[1:]
        return int(c), int(h), int(w)

    @property
    def num_classes(self) -> int | None:
        if self.classes is not None:
            return len(self.classes)
        return None if self.y is None else int(self.y.max()) + 1

    def tensor(self) -> torch.Tensor:
        """The images as a CPU tensor sharing memory with ``x``."""
        return torch.from_numpy(self.x)


def content_sha256(x: np.ndarray, y: np.ndarray | None) -> str:
    """sha256 of the canonical float32 images and int64 labels, with their shapes."""
    digest = hashlib.sha256(_HASH_VERSION)
    images = np.ascontiguousarray(x, dtype=np.float32)
    digest.update(repr(images.shape).encode())
    digest.update(images.tobytes())
    if y is None:
        digest.update(b"no-labels")
    else:
        labels = np.ascontiguousarray(y, dtype=np.int64)
        digest.update(repr(labels.shape).encode())
        digest.update(labels.tobytes())
    return digest.hexdigest()


def load_dataset(spec: str | Path, *, split: str = "test") -> ImageDataset | ImageFiles:
    """Load ``"digits"`` (``split`` picks train, test or all), an ``.npz`` file, or an ImageFolder.

    An ImageFolder is a directory, or a ``.zip`` of one, with one sub-directory of images per
    class; one of images of different sizes is an :class:`ImageFiles` (only a comparison,
    which resizes per model, can read it). ``split`` applies to the built-in digits only.
    """
    if str(spec) == "digits":
        return load_digits(split)
    path = Path(spec)
    if not path.exists():
        raise DatasetError(f"Dataset '{spec}' is neither 'digits' nor an existing file or folder.")
    if path.is_dir():
        return load_image_folder(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return load_npz(path)
    if suffix == ".zip":
        return load_image_folder(path)
    raise DatasetError(
        f"Dataset file '{path.name}' has an unsupported type; use .npz, .zip or a folder."
    )


def training_data(spec: str | Path) -> ImageDataset | tuple[ImageDataset, ImageDataset]:
    """What :func:`models.train` takes for a dataset named by the user.

    The built-in digits give their fixed ``(train, test)`` splits; a file or folder gives the
    whole dataset, of which training holds out a fixed fifth for testing.
    """
    if str(spec) == "digits":
        return load_digits("train"), load_digits("test")
    data = load_dataset(spec)
    if not isinstance(data, ImageDataset):
        raise DatasetError(
            f"The images of '{data.name}' have different sizes; training needs one size "
            "(comparisons resize them per model)."
        )
    return data


def load_digits(split: str = "test") -> ImageDataset:
    """scikit-learn's bundled 8×8 digits (1797 images), scaled to [0, 1], with a fixed split."""
    if split not in DIGITS_SPLITS:
        raise DatasetError(f"Digits split '{split}' is unknown; choose one of {DIGITS_SPLITS}.")
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    x = (bunch.images / _DIGITS_MAX).astype(np.float32)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    if split != "all":
        index = np.arange(len(y))
        train, test = train_test_split(
            index, test_size=_DIGITS_TEST_FRACTION, stratify=y, random_state=_DIGITS_SEED
        )
        chosen = np.sort(train if split == "train" else test)
        x, y = x[chosen], y[chosen]
    classes = [str(c) for c in range(10)]
    return ImageDataset(name=f"digits:{split}", x=np.ascontiguousarray(x), y=y, classes=classes)


def load_npz(
    source: str | Path | bytes,
    *,
    max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
) -> ImageDataset:
    """An ``.npz`` with ``x`` as (N, H, W), (N, H, W, C) or (N, C, H, W) and an optional ``y``.

    The arrays are read into memory whole, so an archive that unpacks to more than
    ``max_bytes``, or whose arrays declare more data than they hold, is refused first.
    """
    name = "upload.npz" if isinstance(source, bytes) else Path(source).name
    if not zipfile.is_zipfile(io.BytesIO(source) if isinstance(source, bytes) else source):
        raise DatasetError(
            f"'{name}' is not an .npz archive: numpy.savez writes a zip of .npy arrays, "
            "and this file is not a zip."
        )
    _check_npz(
        io.BytesIO(source) if isinstance(source, bytes) else source, name, max_bytes, max_members
    )
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with np.load(handle, allow_pickle=False) as archive:
            if "x" not in archive.files:
                raise DatasetError(f"'{name}' has no array named 'x' (found: {archive.files}).")
            x = archive["x"]
            y = archive["y"] if "y" in archive.files else None
    except DatasetError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"'{name}' is not a readable .npz file ({reason(exc)}).") from exc
    images = _as_nchw(x, name)
    labels = None
    if y is not None:
        if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.bool_)):
            raise DatasetError(f"Labels 'y' in '{name}' must be integers, not {y.dtype}.")
        if y.ndim != 1:
            raise DatasetError(f"Labels 'y' in '{name}' must be one-dimensional, not {y.shape}.")
        labels = y.astype(np.int64)
        _check_labels(labels, len(images), name)
    # Labels are class indices, so the classes are 0 … max label, named by their index.
    classes = None if labels is None or not len(labels) else _index_classes(labels)
    return ImageDataset(name=name, x=images, y=labels, classes=classes)


def _index_classes(labels: np.ndarray) -> list[str]:
    return [str(i) for i in range(int(labels.max()) + 1)]


def _check_npz(
    handle: str | Path | io.BytesIO, name: str, max_bytes: int, max_members: int
) -> None:
    try:
        archive = zipfile.ZipFile(handle)
    except (OSError, zipfile.BadZipFile):
        return  # a damaged archive: np.load says what is wrong with it
    with archive:
        try:  # np.load bounds what it inflates by the headers checked below, not by a ratio
            infos = safe_entries(
                archive, name, max_members=max_members, max_bytes=max_bytes, max_ratio=None
            )
        except ArchiveError as exc:
            raise DatasetError(f"{exc}.") from None
        for info in infos:
            if not info.filename.endswith(".npy"):
                continue
            # np.load allocates what an array's header declares before reading its data.
            try:
                with archive.open(info) as stream:
                    version = np.lib.format.read_magic(stream)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(stream)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile):
                return  # np.load reports the unreadable array
            if not dtype.hasobject and math.prod(shape) * dtype.itemsize > info.file_size:
                raise DatasetError(
                    f"'{name}' array '{info.filename[:-4]}' declares shape {tuple(shape)} but "
                    f"holds only {info.file_size} bytes."
                )


def load_image_folder(
    source: str | Path | bytes,
    *,
    max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
) -> ImageDataset | ImageFiles:
    """A directory, or a zip archive of one, holding one sub-directory of images per class.

    Images of one size become an :class:`ImageDataset` (which also keeps the files); images
    of several sizes an :class:`ImageFiles`.

    Archives are read in memory: members with absolute or ``..`` paths, symbolic links, more
    than ``max_members`` entries or more than ``max_bytes`` uncompressed are refused.
    """
    files: dict[str, Callable[[], bytes]]
    budget: int | None = None  # a local directory is trusted; an archive may be an upload
    if isinstance(source, bytes) or Path(source).is_file():
        name = "upload.zip" if isinstance(source, bytes) else Path(source).name
        files = _zip_members(source, name, max_bytes, max_members)
        budget = max_bytes
    else:
        root = Path(source)
        name = root.name
        files = {
            path.relative_to(root).as_posix(): path.read_bytes
            for path in sorted(root.rglob("*"))
            if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
        }
    return _decode_folder(files, name, budget)


def _zip_members(
    source: str | Path | bytes, name: str, max_bytes: int, max_members: int
) -> dict[str, Callable[[], bytes]]:
    try:
        archive = open_zip(source, name)
        infos = safe_entries(
            archive,
            name,
            max_members=max_members,
            max_bytes=max_bytes,
            keep=lambda path: path.suffix.lower() in IMAGE_SUFFIXES,
        )
    except ArchiveError as exc:
        raise DatasetError(f"{exc}.") from None
    return {PurePosixPath(info.filename).as_posix(): _Reader(archive, info, name) for info in infos}


class _Reader:
    """Reads one image's bytes on demand, bounded by the size its directory entry declares."""

    def __init__(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> None:
        self.archive, self.info, self.name = archive, info, name

    def __call__(self) -> bytes:
        try:
            return read_entry(self.archive, self.info, self.name)
        except ArchiveError as exc:
            raise DatasetError(f"{exc}.") from None


def _decode_folder(
    files: dict[str, Callable[[], bytes]], name: str, max_decoded: int | None = None
) -> ImageDataset | ImageFiles:
    paths = [PurePosixPath(p) for p in files]
    # A zip of a folder usually nests everything under that folder's name: strip that level.
    while paths and all(len(p.parts) >= 3 for p in paths) and len({p.parts[0] for p in paths}) == 1:
        paths = [PurePosixPath(*p.parts[1:]) for p in paths]
        files = dict(zip((p.as_posix() for p in paths), files.values(), strict=True))
    if not paths:
        raise DatasetError(f"'{name}' holds no images (looked for {sorted(IMAGE_SUFFIXES)}).")
    if any(len(p.parts) != 2 for p in paths):
        raise DatasetError(
            f"'{name}' must hold one folder of images per class, and nothing deeper."
        )
    classes = sorted({p.parts[0] for p in paths})
    images, labels, blobs = [], [], []
    # Decoded bytes: a small PNG can declare a huge canvas, so an archive has a budget.
    budget = max_decoded
    for key in sorted(files):
        blob = files[key]()
        image = open_image(blob, f"{name}/{key}", budget)
        if budget is not None:
            budget -= image.width * image.height * len(image.getbands())
        images.append(image)
        blobs.append(blob)
        labels.append(classes.index(PurePosixPath(key).parts[0]))
    gray = all(img.mode in ("1", "L", "I", "I;16", "F") for img in images)
    y = np.asarray(labels, dtype=np.int64)
    raw = ImageFiles(
        name=name,
        blobs=tuple(blobs),
        paths=tuple(sorted(files)),
        y=y,
        classes=classes,
        channels=1 if gray else 3,
        sizes=tuple(img.size for img in images),
    )
    if len({img.size for img in images}) > 1:
        return raw  # each model's pipeline resizes them
    mode = "L" if gray else "RGB"
    arrays = [np.asarray(_plain(img).convert(mode), dtype=np.uint8) for img in images]
    x = np.stack(arrays)
    return ImageDataset(name=name, x=_as_nchw(x, name), y=y, classes=classes, files=raw)


def _plain(image: Image.Image) -> Image.Image:
    """A palette image through RGBA, so that its transparency does not warn on conversion."""
    return image.convert("RGBA") if image.mode == "P" else image


def _as_nchw(x: np.ndarray, name: str) -> np.ndarray:
    """Images as float32 (N, C, H, W); uint8 sources are scaled to [0, 1]."""
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise DatasetError(f"Images 'x' in '{name}' must be uint8 or float, not {x.dtype}.")
    if np.issubdtype(x.dtype, np.integer) and x.dtype != np.uint8:
        raise DatasetError(f"Integer images 'x' in '{name}' must be uint8, not {x.dtype}.")
    if x.ndim == 3:
        x = x[:, None, :, :]
    elif x.ndim == 4:
        channels_first, channels_last = x.shape[1] <= 4, x.shape[3] <= 4
        if channels_last and not channels_first:
            x = x.transpose(0, 3, 1, 2)
        elif not channels_first:
            raise DatasetError(
                f"Images 'x' in '{name}' have shape {x.shape}: no axis of at most 4 channels."
            )
    else:
        raise DatasetError(
            f"Images 'x' in '{name}' must be (N, H, W), (N, H, W, C) or (N, C, H, W), "
            f"not {x.ndim}-dimensional {x.shape}."
        )
    images = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
    return np.ascontiguousarray(images)


def _check_images(x: np.ndarray, name: str) -> None:
    if x.ndim != 4 or x.dtype != np.float32:
        raise DatasetError(
            f"Images of '{name}' must be float32 (N, C, H, W), not {x.dtype} {x.shape}."
        )
    if x.shape[0] == 0:
        raise DatasetError(f"'{name}' holds no samples.")
    if 0 in x.shape[1:]:
        raise DatasetError(f"Images of '{name}' have an empty dimension: {x.shape}.")
    if not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise DatasetError(f"'{name}' has {bad} pixel values that are NaN or infinite.")


def _check_labels(y: np.ndarray, n: int, name: str) -> None:
    if len(y) != n:
        raise DatasetError(f"'{name}' has {n} images but {len(y)} labels.")
    if len(y) and int(y.min()) < 0:
        raise DatasetError(f"Labels of '{name}' must be non-negative class indices.")
