"""Image datasets: the built-in digits, ``.npz`` arrays and ImageFolder trees or archives.

Every source becomes the same :class:`ImageDataset`: float32 images shaped (N, C, H, W), optional
int64 labels and a content sha256 that depends only on those arrays, so the same images give
the same hash whatever file they came from. Nothing is ever unpickled and archives are never
extracted to disk. Reading is bounded by the result: an ``.npz`` is checked from its headers
and decoded one slice at a time into the final array (:mod:`analysis.data.npz`), an ImageFolder one
image at a time. :func:`describe_dataset` checks a file the same way without keeping its images
(what a service registering an upload needs), in memory that does not grow with the dataset.
Archive safety is :mod:`models.archives`' (imported where an archive is opened: importing
:mod:`models` loads torch and timm, which a service registering the built-in digits at start-up
does not need).
"""

from __future__ import annotations

import hashlib
import math
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath

import numpy as np
import torch
from PIL import Image

from analysis.data.images import ImageFiles, files_sha256, open_image, peek_image
from analysis.data.npz import NpzArchive, rows_per_slice
from analysis.data.ranges import ValueRange, declared_range, infer_range
from analysis.errors import DatasetError, DatasetTooLarge

__all__ = [
    "DIGITS_SPLITS",
    "IMAGE_SUFFIXES",
    "DatasetInfo",
    "ImageDataset",
    "array_slices",
    "describe_dataset",
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

    ``x`` holds values in [0, 1] for integer sources; float sources keep their values, and
    ``value_range`` says which stand for black and white (:mod:`analysis.data.ranges`; None:
    inferred from the values when a model's pipeline needs it, see :meth:`pixel_range`).
    ``sha256`` hashes the arrays themselves (and a declared range), so re-encoding a dataset
    does not change it.
    """

    name: str
    x: np.ndarray
    y: np.ndarray | None = None
    classes: list[str] | None = None
    sha256: str = field(default="")
    files: ImageFiles | None = None  # the original files of an ImageFolder, for pipelines
    value_range: ValueRange | tuple[float, float] | None = None

    def __post_init__(self) -> None:
        _check_images(self.x, self.name)
        if self.y is not None:
            _check_labels(self.y, len(self.x), self.name)
        if self.value_range is not None and not isinstance(self.value_range, ValueRange):
            declared = declared_range(self.value_range, f"'{self.name}'")
            object.__setattr__(self, "value_range", declared)
        if not self.sha256:
            object.__setattr__(self, "sha256", content_sha256(self.x, self.y, self.value_range))

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

    def pixel_range(self) -> ValueRange:
        """``value_range``, or the range inferred from ``x`` (read once, then kept)."""
        if not isinstance(self.value_range, ValueRange):
            object.__setattr__(self, "value_range", infer_range(array_slices(self.x)))
        assert isinstance(self.value_range, ValueRange)
        return self.value_range


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset file holds, without its images (:func:`describe_dataset`): the same
    name, length, image shape, classes and content hash its :class:`ImageDataset` (or
    :class:`ImageFiles`) has; ``shape`` is (C, 0, 0) when the images' sizes vary."""

    name: str
    n: int
    shape: tuple[int, int, int]
    classes: list[str] | None
    sha256: str
    value_range: ValueRange | None = None  # an .npz's (image files are pixels: 8 bits)

    def __len__(self) -> int:
        return self.n


class _ContentHash:
    """:func:`content_sha256` fed the images in slices along the first axis, in order."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self._digest = hashlib.sha256(_HASH_VERSION)
        self._digest.update(repr(tuple(int(v) for v in shape)).encode())

    def images(self, part: np.ndarray) -> None:
        self._digest.update(np.ascontiguousarray(part, dtype=np.float32).data)  # no copy

    def finish(self, y: np.ndarray | None, value_range: object = None) -> str:
        if y is None:
            self._digest.update(b"no-labels")
        else:
            labels = np.ascontiguousarray(y, dtype=np.int64)
            self._digest.update(repr(labels.shape).encode())
            self._digest.update(labels.data)
        if isinstance(value_range, ValueRange) and value_range.source == "declared":
            # the same numbers declared as other pixels are other images
            self._digest.update(f"range:{value_range.low!r},{value_range.high!r}".encode())
        return self._digest.hexdigest()


def content_sha256(x: np.ndarray, y: np.ndarray | None, value_range: object = None) -> str:
    """sha256 of the canonical float32 images and int64 labels, with their shapes (and the
    value range, where one was declared)."""
    images = np.ascontiguousarray(x, dtype=np.float32)
    digest = _ContentHash(images.shape)
    digest.images(images)
    return digest.finish(y, value_range)


def array_slices(x: np.ndarray | torch.Tensor) -> Iterator[np.ndarray | torch.Tensor]:
    """``x`` in slices along its first axis of about SLICE_BYTES each (views, no copies)."""
    itemsize = x.element_size() if isinstance(x, torch.Tensor) else x.itemsize
    step = rows_per_slice(math.prod(x.shape[1:]) * itemsize)
    for start in range(0, len(x), step):
        yield x[start : start + step]


def _check_decoded(shape: tuple[int, ...], name: str, max_decoded: int | None) -> None:
    """DatasetTooLarge when images of ``shape`` take more than ``max_decoded`` as float32."""
    nbytes = math.prod(shape) * 4
    if max_decoded is not None and nbytes > max_decoded:
        raise DatasetTooLarge(
            f"'{name}' holds {shape[0]} images of {'×'.join(map(str, shape[1:]))}: "
            f"{_size(nbytes)} as float32, more than the {_size(max_decoded)} allowed."
        )


def _size(nbytes: int) -> str:
    """Bytes in words: exact below a MiB (``2560 bytes``), else ``1.5 MiB``, ``2.0 GiB``."""
    if nbytes < 1 << 20:
        return f"{nbytes} bytes"
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes < 1 << 30 else f"{nbytes / (1 << 30):.1f} GiB"


def describe_dataset(spec: str | Path, *, max_decoded: int | None = None) -> DatasetInfo:
    """What :func:`load_dataset` would give for ``spec``, checked the same way, without
    keeping its images: an ``.npz`` passes through one slice at a time, an ImageFolder one
    image at a time, so the memory this takes does not grow with the dataset.

    ``max_decoded`` bounds the bytes of the images as float32 (what a comparison holds),
    checked from the headers before anything is decoded (:class:`DatasetTooLarge`).
    """
    if str(spec) == "digits":
        data = load_digits("test")
        return DatasetInfo(data.name, len(data), data.shape, data.classes, data.sha256)
    path = _existing(spec)
    if path.suffix.lower() == ".npz" and path.is_file():
        _, shape, labels, value_range, sha = _read_npz(
            path,
            path.name,
            DEFAULT_MAX_ARCHIVE_BYTES,
            DEFAULT_MAX_ARCHIVE_MEMBERS,
            max_decoded,
            keep=False,
        )
        n, c, h, w = shape
        return DatasetInfo(path.name, n, (c, h, w), _classes(labels), sha, value_range)
    files, name, budget = _folder_files(
        path, DEFAULT_MAX_ARCHIVE_BYTES, DEFAULT_MAX_ARCHIVE_MEMBERS
    )
    return _describe_folder(files, name, budget, max_decoded)


def load_dataset(spec: str | Path, *, split: str = "test") -> ImageDataset | ImageFiles:
    """Load ``"digits"`` (``split`` picks train, test or all), an ``.npz`` file, or an ImageFolder.

    An ImageFolder is a directory, or a ``.zip`` of one, of images in one folder (a dataset
    without labels: a comparison needs none) or in one sub-directory per class (labelled, as
    training needs); one of images of different sizes is an :class:`ImageFiles` (only a
    comparison, which resizes per model, can read it). ``split`` applies to the built-in
    digits only.
    """
    if str(spec) == "digits":
        return load_digits(split)
    path = _existing(spec)
    if path.is_file() and path.suffix.lower() == ".npz":
        return load_npz(path)
    return load_image_folder(path)


def _existing(spec: str | Path) -> Path:
    """The file or folder ``spec`` names, of a type a dataset can be."""
    path = Path(spec)
    if not path.exists():
        raise DatasetError(f"Dataset '{spec}' is neither 'digits' nor an existing file or folder.")
    if path.is_file() and path.suffix.lower() not in (".npz", ".zip"):
        raise DatasetError(
            f"Dataset file '{path.name}' has an unsupported type; use .npz, .zip or a folder."
        )
    return path


def training_data(spec: str | Path) -> ImageDataset | tuple[ImageDataset, ImageDataset]:
    """What :func:`models.train` takes for a dataset named by the user.

    The built-in digits give their fixed ``(train, test)`` splits; a file or folder gives the
    whole dataset, of which training holds out a fixed fifth for testing. A dataset without
    labels, or of images of several sizes, is refused in one sentence.
    """
    if str(spec) == "digits":
        return load_digits("train"), load_digits("test")
    data = load_dataset(spec)
    if data.y is None:
        raise DatasetError(
            f"'{data.name}' has no labels, so no model can be trained on it (training needs "
            "its images in one folder per class, or an .npz with y; comparing needs no labels)."
        )
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
    max_decoded: int | None = None,
) -> ImageDataset:
    """An ``.npz`` with ``x`` as (N, H, W), (N, H, W, C) or (N, C, H, W), an optional ``y`` and,
    for float images, an optional ``value_range`` ``[low, high]``: the values that stand for
    black and white (else inferred from the values, :mod:`analysis.data.ranges`).

    The arrays' headers are checked before any data is read (an archive that unpacks to more
    than ``max_bytes``, an array that declares more than it holds, images that would take more
    than ``max_decoded`` bytes as float32), then ``x`` is decoded slice by slice into the
    final array: beyond it, this holds one slice.
    """
    name = "upload.npz" if isinstance(source, bytes) else Path(source).name
    x, _, labels, value_range, sha = _read_npz(
        source, name, max_bytes, max_members, max_decoded, keep=True
    )
    assert x is not None
    return ImageDataset(
        name=name,
        x=x,
        y=labels,
        classes=_classes(labels),
        sha256=sha,
        value_range=value_range,
    )


def _read_npz(
    source: str | Path | bytes,
    name: str,
    max_bytes: int,
    max_members: int,
    max_decoded: int | None,
    *,
    keep: bool,
) -> tuple[np.ndarray | None, tuple[int, int, int, int], np.ndarray | None, ValueRange, str]:
    """(images if ``keep``, their (N, C, H, W), labels, value range, content sha256) of an
    ``.npz``, streamed: every check from the headers first, then one slice of ``x`` at a time
    (which also finds the range of values, where neither uint8 nor ``value_range`` says it)."""
    with NpzArchive(source, name, max_bytes=max_bytes, max_members=max_members) as archive:
        if "x" not in archive.arrays:
            raise DatasetError(
                f"'{name}' has no array named 'x' (found: {sorted(archive.arrays)})."
            )
        stored = archive.arrays["x"]
        layout = _Layout.of(stored.shape, stored.dtype, name)
        _check_decoded(layout.shape, name, max_decoded)
        labels = _npz_labels(archive, name, layout.shape[0])
        declared = _npz_range(archive, name)
        x = np.empty(layout.shape, np.float32) if keep else None
        digest = _ContentHash(layout.shape)
        done = bad = 0
        extremes: list[np.ndarray] = []
        for raw in archive.slices("x"):
            part = layout.convert(raw)
            if not layout.scale:  # uint8 sources are finite
                finite = np.isfinite(part)
                bad += int(np.count_nonzero(~finite))
                if not bad and declared is None:
                    extremes.append(np.array([part.min(), part.max()]))
            digest.images(part)
            if x is not None:
                x[done : done + len(part)] = part
            done += len(part)
    if bad:
        raise DatasetError(f"'{name}' has {bad} pixel values that are NaN or infinite.")
    if layout.scale:
        value_range = ValueRange(0.0, 1.0, "uint8")
    else:
        value_range = declared or infer_range(extremes)
    return x, layout.shape, labels, value_range, digest.finish(labels, value_range)


def _npz_range(archive: NpzArchive, name: str) -> ValueRange | None:
    """The ``value_range`` an ``.npz`` declares for its float images (two numbers), if any."""
    stored = archive.arrays.get("value_range")
    if stored is None:
        return None
    if stored.shape != (2,) or not np.issubdtype(stored.dtype, np.number):
        raise DatasetError(
            f"'value_range' in '{name}' must be two numbers [low, high], not "
            f"{stored.dtype} {stored.shape}."
        )
    if archive.arrays["x"].dtype == np.uint8:
        raise DatasetError(
            f"'{name}' declares a value_range for uint8 images, which are 0–255 by their type; "
            "leave value_range out (it is for float images)."
        )
    return declared_range(archive.read("value_range"), f"'{name}'")


def _npz_labels(archive: NpzArchive, name: str, n: int) -> np.ndarray | None:
    stored = archive.arrays.get("y")
    if stored is None:
        return None
    if not (np.issubdtype(stored.dtype, np.integer) or np.issubdtype(stored.dtype, np.bool_)):
        raise DatasetError(f"Labels 'y' in '{name}' must be integers, not {stored.dtype}.")
    if len(stored.shape) != 1:
        raise DatasetError(f"Labels 'y' in '{name}' must be one-dimensional, not {stored.shape}.")
    if stored.shape[0] != n:  # before reading them
        raise DatasetError(f"'{name}' has {n} images but {stored.shape[0]} labels.")
    labels = archive.read("y").astype(np.int64)
    _check_labels(labels, n, name)
    return labels


def _classes(labels: np.ndarray | None) -> list[str] | None:
    """Labels are class indices, so the classes are 0 … max label, named by their index."""
    if labels is None or not len(labels):
        return None
    return [str(i) for i in range(int(labels.max()) + 1)]


def load_image_folder(
    source: str | Path | bytes,
    *,
    max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    max_members: int = DEFAULT_MAX_ARCHIVE_MEMBERS,
    max_decoded: int | None = None,
) -> ImageDataset | ImageFiles:
    """A directory, or a zip archive of one, holding its images in one folder (no labels), or
    in one sub-directory per class (the folders' names are the classes, sorted). Folders that
    every image shares are stripped first (a zip of ``photos/`` holds ``photos/...``), and
    hidden files and macOS's ``__MACOSX`` folder are skipped.

    Images of one size become an :class:`ImageDataset` (which also keeps the files); images
    of several sizes an :class:`ImageFiles`.

    Archives are read in memory: members with absolute or ``..`` paths, symbolic links, more
    than ``max_members`` entries or more than ``max_bytes`` uncompressed are refused, and so
    are images that decode to more than ``max_bytes`` together (checked from their headers)
    or, of one size, would take more than ``max_decoded`` bytes as float32. Each image is
    decoded into the final array in turn.
    """
    files, name, budget = _folder_files(source, max_bytes, max_members)
    plan = _plan_folder(files, name, budget, max_decoded)
    blobs, x = [], None
    if plan.uniform:
        x = np.empty((len(plan.keys), *plan.shape), np.float32)
    for i, (blob, image) in enumerate(_decoded(files, plan)):
        blobs.append(blob)
        if x is not None:
            x[i] = _image_chw(image, plan)
    raw = ImageFiles(
        name=name,
        blobs=tuple(blobs),
        paths=tuple(plan.keys),
        y=plan.y,
        classes=plan.classes,
        channels=plan.shape[0],
        sizes=plan.sizes,
    )
    if x is None:
        return raw  # each model's pipeline resizes them
    return ImageDataset(name=name, x=x, y=plan.y, classes=plan.classes, files=raw)


def _describe_folder(
    files: dict[str, Callable[[], bytes]], name: str, budget: int | None, max_decoded: int | None
) -> DatasetInfo:
    """:func:`load_image_folder`'s checks and hash, holding one image at a time."""
    plan = _plan_folder(files, name, budget, max_decoded)
    n = len(plan.keys)
    if plan.uniform:
        digest = _ContentHash((n, *plan.shape))
        for _, image in _decoded(files, plan):
            digest.images(_image_chw(image, plan))
        sha = digest.finish(plan.y)
    else:
        digests = [hashlib.sha256(blob).digest() for blob, _ in _decoded(files, plan)]
        sha = files_sha256(digests, plan.y)
    return DatasetInfo(name, n, plan.shape, plan.classes, sha)


def _folder_files(
    source: str | Path | bytes, max_bytes: int, max_members: int
) -> tuple[dict[str, Callable[[], bytes]], str, int | None]:
    """The image files of a folder or zip by path, read on demand; its name; the budget of
    decoded bytes (None for a local directory, which is trusted; an archive may be an upload)."""
    if isinstance(source, bytes) or Path(source).is_file():
        name = "upload.zip" if isinstance(source, bytes) else Path(source).name
        return _zip_members(source, name, max_bytes, max_members), name, max_bytes
    root = Path(source)
    files: dict[str, Callable[[], bytes]] = {
        path.relative_to(root).as_posix(): path.read_bytes
        for path in sorted(root.rglob("*"))
        if path.is_file() and _is_image(path.relative_to(root))
    }
    return files, root.name, None


def _is_image(path: PurePath) -> bool:
    """An image file of the dataset: an image suffix, and no hidden part (``.x``) or macOS's
    ``__MACOSX`` copies of the files' metadata on the way to it."""
    hidden = any(part.startswith(".") or part == "__MACOSX" for part in path.parts)
    return path.suffix.lower() in IMAGE_SUFFIXES and not hidden


def _zip_members(
    source: str | Path | bytes, name: str, max_bytes: int, max_members: int
) -> dict[str, Callable[[], bytes]]:
    from models.archives import ArchiveError, open_zip, safe_entries

    try:
        archive = open_zip(source, name)
        infos = safe_entries(
            archive,
            name,
            max_members=max_members,
            max_bytes=max_bytes,
            keep=_is_image,
        )
    except ArchiveError as exc:
        raise DatasetError(f"{exc}.") from None
    return {PurePosixPath(info.filename).as_posix(): _Reader(archive, info, name) for info in infos}


class _Reader:
    """Reads one image's bytes on demand, bounded by the size its directory entry declares."""

    def __init__(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> None:
        self.archive, self.info, self.name = archive, info, name

    def __call__(self) -> bytes:
        from models.archives import ArchiveError, read_entry

        try:
            return read_entry(self.archive, self.info, self.name)
        except ArchiveError as exc:
            raise DatasetError(f"{exc}.") from None


@dataclass(frozen=True)
class _Folder:
    """An ImageFolder as its paths and image headers describe it, no pixel decoded yet."""

    name: str
    keys: list[str]  # the files in order (sorted), as the reader names them
    y: np.ndarray | None  # None: the images are not in class folders
    classes: list[str] | None
    sizes: tuple[tuple[int, int], ...]
    gray: bool

    @property
    def uniform(self) -> bool:
        return len(set(self.sizes)) == 1

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every image; (C, 0, 0) when their sizes vary."""
        (w, h), channels = self.sizes[0], 1 if self.gray else 3
        return (channels, h, w) if self.uniform else (channels, 0, 0)


def _plan_folder(
    files: dict[str, Callable[[], bytes]],
    name: str,
    budget: int | None,
    max_decoded: int | None,
) -> _Folder:
    """Check an ImageFolder's layout and every image's header (size, mode, the budget of
    decoded bytes) before any is decoded. Re-keys ``files`` when shared folders are stripped."""
    paths = [PurePosixPath(p) for p in files]
    if not paths:
        raise DatasetError(f"'{name}' holds no images (looked for {sorted(IMAGE_SUFFIXES)}).")
    # A zip of a folder usually nests everything under that folder's name (or deeper): strip
    # the folders every image shares. What is left is the images themselves (no labels), or
    # one folder per class.
    while all(len(p.parts) >= 2 for p in paths) and len({p.parts[0] for p in paths}) == 1:
        paths = [PurePosixPath(*p.parts[1:]) for p in paths]
        renamed = dict(zip((p.as_posix() for p in paths), files.values(), strict=True))
        files.clear()
        files.update(renamed)
    depths = {len(p.parts) for p in paths}
    if depths != {1} and depths != {2}:
        shallow = min(paths, key=lambda p: len(p.parts))
        deep = max(paths, key=lambda p: len(p.parts))
        where = (
            f"'{shallow}' and '{deep}' are at different depths"
            if len(shallow.parts) != len(deep.parts)
            else f"'{deep}' is {len(deep.parts) - 1} folders deep"
        )
        raise DatasetError(
            f"'{name}' must hold its images in one folder (a dataset without labels) or in one "
            f"folder per class (labelled), but {where}."
        )
    labelled = depths == {2}
    classes = sorted({p.parts[0] for p in paths}) if labelled else None
    keys = sorted(files)
    sizes, modes = [], []
    left = budget  # decoded bytes: a small PNG can declare a huge canvas
    for key in keys:
        image = peek_image(files[key](), f"{name}/{key}", left)
        if left is not None:
            left -= image.width * image.height * len(image.getbands())
        sizes.append(image.size)
        modes.append(image.mode)
    plan = _Folder(
        name=name,
        keys=keys,
        y=(
            np.asarray([classes.index(PurePosixPath(k).parts[0]) for k in keys], dtype=np.int64)
            if classes
            else None
        ),
        classes=classes,
        sizes=tuple(sizes),
        gray=all(mode in ("1", "L", "I", "I;16", "F") for mode in modes),
    )
    if plan.uniform:
        _check_decoded((len(keys), *plan.shape), name, max_decoded)
    return plan


def _decoded(
    files: dict[str, Callable[[], bytes]], plan: _Folder
) -> Iterator[tuple[bytes, Image.Image]]:
    """Each file of the plan with its image decoded, one at a time."""
    for key in plan.keys:
        blob = files[key]()
        yield blob, open_image(blob, f"{plan.name}/{key}")


def _image_chw(image: Image.Image, plan: _Folder) -> np.ndarray:
    """One image of a uniform folder as float32 (C, H, W) in [0, 1]."""
    mode = "L" if plan.gray else "RGB"
    pixels = np.asarray(image if image.mode == mode else _plain(image).convert(mode), np.uint8)
    chw: np.ndarray = _as_nchw(pixels[None], plan.name)[0]
    return chw


def _plain(image: Image.Image) -> Image.Image:
    """A palette image through RGBA, so that its transparency does not warn on conversion."""
    return image.convert("RGBA") if image.mode == "P" else image


@dataclass(frozen=True)
class _Layout:
    """How stored images become float32 (N, C, H, W), decided from their shape and dtype
    alone (an ``.npy`` header), so that a wrong array is refused before its data is read."""

    shape: tuple[int, int, int, int]  # the (N, C, H, W) they become
    add_channel: bool
    channels_last: bool
    scale: bool  # uint8, scaled to [0, 1]

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: np.dtype, name: str) -> _Layout:
        if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
            raise DatasetError(f"Images 'x' in '{name}' must be uint8 or float, not {dtype}.")
        if np.issubdtype(dtype, np.integer) and dtype != np.uint8:
            raise DatasetError(f"Integer images 'x' in '{name}' must be uint8, not {dtype}.")
        channels_last = False
        if len(shape) == 3:
            n, h, w = shape
            c = 1
        elif len(shape) == 4:
            channels_first, channels_last = shape[1] <= 4, shape[3] <= 4
            if channels_last and not channels_first:
                n, h, w, c = shape
            elif not channels_first:
                raise DatasetError(
                    f"Images 'x' in '{name}' have shape {shape}: no axis of at most 4 channels."
                )
            else:
                n, c, h, w = shape
                channels_last = False
        else:
            raise DatasetError(
                f"Images 'x' in '{name}' must be (N, H, W), (N, H, W, C) or (N, C, H, W), "
                f"not {len(shape)}-dimensional {shape}."
            )
        nchw = (int(n), int(c), int(h), int(w))
        if nchw[0] == 0:
            raise DatasetError(f"'{name}' holds no samples.")
        if 0 in nchw[1:]:
            raise DatasetError(f"Images of '{name}' have an empty dimension: {nchw}.")
        return cls(nchw, len(shape) == 3, channels_last, dtype == np.uint8)

    def convert(self, part: np.ndarray) -> np.ndarray:
        """Rows of the stored images as C-contiguous float32 (n, C, H, W)."""
        if self.add_channel:
            part = part[:, None, :, :]
        if self.channels_last:
            part = part.transpose(0, 3, 1, 2)
        images = np.ascontiguousarray(part, dtype=np.float32)
        if self.scale:
            images /= 255.0  # a new array: the float32 copy of uint8 rows
        return images


def _as_nchw(x: np.ndarray, name: str) -> np.ndarray:
    """Images as float32 (N, C, H, W); uint8 sources are scaled to [0, 1]."""
    return _Layout.of(x.shape, x.dtype, name).convert(x)


def _check_images(x: np.ndarray, name: str) -> None:
    if x.ndim != 4 or x.dtype != np.float32:
        raise DatasetError(
            f"Images of '{name}' must be float32 (N, C, H, W), not {x.dtype} {x.shape}."
        )
    if x.shape[0] == 0:
        raise DatasetError(f"'{name}' holds no samples.")
    if 0 in x.shape[1:]:
        raise DatasetError(f"Images of '{name}' have an empty dimension: {x.shape}.")
    bad = sum(int(np.count_nonzero(~np.isfinite(part))) for part in array_slices(x))
    if bad:
        raise DatasetError(f"'{name}' has {bad} pixel values that are NaN or infinite.")


def _check_labels(y: np.ndarray, n: int, name: str) -> None:
    if len(y) != n:
        raise DatasetError(f"'{name}' has {n} images but {len(y)} labels.")
    if len(y) and int(y.min()) < 0:
        raise DatasetError(f"Labels of '{name}' must be non-negative class indices.")
