"""The arrays of an ``.npz`` archive, read in bounded memory.

``np.load`` inflates a member whole and allocates what its header declares before it reads a
byte of data, so a small, well-compressed upload can ask for any amount of memory. Here the
zip's directory is checked first (:func:`models.archives.safe_entries`: entry count, paths,
links, total unpacked size), every member's ``.npy`` header is parsed and checked against the
size its directory entry declares before any data is read (``numpy.lib.format.read_magic`` /
``read_array_header_*``), and the data of an array is streamed in slices along its first
axis, so a reader holds one slice at a time whatever the archive's size. Arrays of Python
objects are refused from their header: nothing is ever unpickled.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
from numpy.lib import format as npy

from analysis.data.images import reason
from analysis.errors import DatasetError

__all__ = ["SLICE_BYTES", "NpyHeader", "NpzArchive", "rows_per_slice"]

# What one slice of an array holds at most (at least one row along the first axis).
SLICE_BYTES = 4 << 20
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def rows_per_slice(row_bytes: int, max_bytes: int | None = None) -> int:
    """How many rows of ``row_bytes`` one slice holds: ``max_bytes`` (default SLICE_BYTES)
    worth, and at least one."""
    return max(1, (max_bytes or SLICE_BYTES) // max(row_bytes, 1))


@dataclass(frozen=True)
class NpyHeader:
    """One array of the archive as its header declares it (no data read)."""

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran_order: bool
    info: zipfile.ZipInfo

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class NpzArchive:
    """An ``.npz`` (a path or bytes) whose arrays are checked from their headers on opening.

    ``max_bytes`` bounds what the archive's members unpack to together, ``max_members`` its
    entries. Every refusal is a :class:`DatasetError` of one sentence naming the file.
    """

    def __init__(
        self, source: str | Path | bytes, name: str, *, max_bytes: int, max_members: int
    ) -> None:
        from models.archives import ArchiveError, safe_entries  # models: torch, timm; on use

        self.name = name
        handle: str | Path | IO[bytes] = io.BytesIO(source) if isinstance(source, bytes) else source
        try:
            self._zip = zipfile.ZipFile(handle)
        except (OSError, zipfile.BadZipFile):
            raise DatasetError(
                f"'{name}' is not an .npz archive: numpy.savez writes a zip of .npy arrays, "
                "and this file is not a zip."
            ) from None
        try:
            infos = safe_entries(
                self._zip, name, max_members=max_members, max_bytes=max_bytes, max_ratio=None
            )
            self.arrays = {
                info.filename[:-4]: self._header(info)
                for info in infos
                if info.filename.endswith(".npy")
            }
        except ArchiveError as exc:
            self.close()
            raise DatasetError(f"{exc}.") from None
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    def _unreadable(self, key: str, exc: BaseException) -> DatasetError:
        return DatasetError(
            f"'{self.name}' is not a readable .npz file (array '{key}': {reason(exc)})."
        )

    def _header(self, info: zipfile.ZipInfo) -> NpyHeader:
        key = info.filename[:-4]
        try:
            with self._zip.open(info) as stream:
                shape, fortran, dtype = _read_header(stream)
        except _UNREADABLE as exc:
            raise self._unreadable(key, exc) from None
        if dtype.hasobject:
            raise DatasetError(
                f"'{self.name}' is not a readable .npz file: array '{key}' holds Python "
                "objects, which are never unpickled."
            )
        header = NpyHeader(key, tuple(int(v) for v in shape), dtype, bool(fortran), info)
        if header.nbytes > info.file_size:
            raise DatasetError(
                f"'{self.name}' array '{key}' declares shape {header.shape} but holds only "
                f"{info.file_size} bytes."
            )
        return header

    def read(self, key: str) -> np.ndarray:
        """The whole array ``key`` (the caller has bounded its declared size)."""
        header = self.arrays[key]
        with self._data(header) as stream:
            data = self._exactly(stream, header, header.nbytes)
        order: Literal["C", "F"] = "F" if header.fortran_order else "C"
        array: np.ndarray = np.frombuffer(data, header.dtype).reshape(header.shape, order=order)
        return array

    def slices(self, key: str, max_bytes: int | None = None) -> Iterator[np.ndarray]:
        """Array ``key`` in C-ordered slices along its first axis, each of at most
        ``max_bytes`` (default SLICE_BYTES; at least one row). A Fortran-ordered array has
        its first axis scattered through the file, so it is read whole first (its declared
        size, bounded by the caller) and sliced after."""
        header = self.arrays[key]
        if not header.shape:
            raise DatasetError(f"'{self.name}' array '{key}' is a scalar, not an array.")
        n, row_shape = header.shape[0], header.shape[1:]
        row = math.prod(row_shape) * header.dtype.itemsize
        rows = rows_per_slice(row, max_bytes) if row else max(n, 1)
        if header.fortran_order and len(row_shape) > 0:
            whole = self.read(key)
            for start in range(0, n, rows):
                yield np.ascontiguousarray(whole[start : start + rows])
            return
        with self._data(header) as stream:
            for start in range(0, n, rows):
                count = min(rows, n - start)
                data = self._exactly(stream, header, count * row)
                yield np.frombuffer(data, header.dtype).reshape((count, *row_shape))

    def _data(self, header: NpyHeader) -> IO[bytes]:
        """The member's stream, positioned after its header."""
        try:
            stream = self._zip.open(header.info)
            _read_header(stream)
        except _UNREADABLE as exc:
            raise self._unreadable(header.key, exc) from None
        return stream

    def _exactly(self, stream: IO[bytes], header: NpyHeader, size: int) -> bytes:
        try:
            data = stream.read(size)
        except _UNREADABLE as exc:
            raise self._unreadable(header.key, exc) from None
        if len(data) != size:
            raise DatasetError(
                f"'{self.name}' array '{header.key}' ends before the data its header declares."
            )
        return data


def _read_header(stream: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    version = npy.read_magic(stream)
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, fortran, dtype = read(stream)
    return shape, fortran, dtype
