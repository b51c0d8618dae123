"""Reading zip archives a user sent, safely: the one place that decides which entries may be read.

A model folder (:mod:`models.hub`) and a dataset (``analysis.data.datasets``) both arrive as zips.
They are never extracted wholesale: :func:`safe_entries` refuses an archive with too many
entries, an absolute, drive or ``..`` path (zip slip), a symbolic link, two entries of one path
(a reader would see only one of them), more uncompressed bytes than allowed, or an entry
compressed suspiciously well (a bomb); :func:`read_entry` and
:func:`copy_entry` then read one entry, never more than its directory entry declares. Every
refusal is an :class:`ArchiveError` of one sentence naming the archive and the entry; a caller
re-raises it as its own error (a checkpoint's, a dataset's).
"""

from __future__ import annotations

import io
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from models.errors import ModelError

__all__ = [
    "MAX_COMPRESSION_RATIO",
    "ArchiveError",
    "copy_entry",
    "open_zip",
    "read_entry",
    "safe_entries",
]

# Deflate of images or float weights stays far below this ratio; more is a bomb.
MAX_COMPRESSION_RATIO = 200


class ArchiveError(ModelError):
    """An archive that is unreadable or unsafe to read."""

    code = "invalid_archive"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().rstrip(".")
    return text.splitlines()[0] if text else type(exc).__name__


def open_zip(source: str | Path | bytes | IO[bytes], name: str) -> zipfile.ZipFile:
    """The zip archive ``source`` (a path, bytes or a binary file), or an ArchiveError."""
    try:
        return zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ArchiveError(f"'{name}' is not a readable zip archive ({_reason(exc)})") from None


def safe_entries(
    archive: zipfile.ZipFile,
    name: str,
    *,
    max_members: int,
    max_bytes: int,
    keep: Callable[[PurePosixPath], bool] | None = None,
    max_ratio: float | None = MAX_COMPRESSION_RATIO,
) -> list[zipfile.ZipInfo]:
    """The file entries of ``archive`` that ``keep`` selects, once the whole archive is safe.

    Every entry's path and type is checked; the kept files together may unpack to at most
    ``max_bytes``, and none may be compressed more than ``max_ratio`` times (None: a reader
    that bounds what it decompresses by other means).
    """
    infos = archive.infolist()
    if len(infos) > max_members:
        raise ArchiveError(
            f"'{name}' has {len(infos)} entries, more than the {max_members} allowed"
        )
    total = 0
    kept = []
    seen: set[str] = set()
    repeated: list[str] = []
    for info in infos:
        path = PurePosixPath(info.filename)
        if info.filename.startswith(("/", "\\")) or ".." in path.parts or ":" in info.filename:
            raise ArchiveError(f"'{name}' holds an entry with an unsafe path: '{info.filename}'")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise ArchiveError(f"'{name}' holds a symbolic link, which is not allowed: '{path}'")
        if info.is_dir() or (keep is not None and not keep(path)):
            continue
        if path.as_posix() in seen:  # a zip may hold one name twice; a reader sees one of them
            repeated.append(path.as_posix())
        seen.add(path.as_posix())
        total += info.file_size
        if total > max_bytes:
            raise ArchiveError(f"'{name}' unpacks to more than {max_bytes} bytes")
        ratio = info.file_size / info.compress_size if info.compress_size else 0.0
        if max_ratio is not None and ratio > max_ratio:
            raise ArchiveError(f"'{name}' entry '{path}' is compressed suspiciously well")
        kept.append(info)
    if repeated:
        raise ArchiveError(
            f"'{name}' holds {len(repeated)} {'entry' if len(repeated) == 1 else 'entries'} "
            f"whose path another entry already has (first '{repeated[0]}'), so which file is "
            "meant cannot be told; give each file its own name"
        )
    return kept


def _limit(info: zipfile.ZipInfo, name: str, limit: int | None) -> None:
    if limit is not None and info.file_size > limit:
        raise ArchiveError(f"'{name}' entry '{info.filename}' is larger than {limit} bytes")


def read_entry(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, limit: int | None = None
) -> bytes:
    """The bytes of one entry, reading no more than it declares (and at most ``limit``)."""
    _limit(info, name, limit)
    with archive.open(info) as stream:
        data = stream.read(info.file_size + 1)
    if len(data) > info.file_size:
        raise ArchiveError(f"'{name}' entry '{info.filename}' lies about its size")
    return data


def copy_entry(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, dest: Path, limit: int
) -> None:
    """Copy one entry to ``dest`` in chunks, no more than it declares (and at most ``limit``)."""
    _limit(info, name, limit)
    left = info.file_size
    with archive.open(info) as src, dest.open("wb") as out:
        while chunk := src.read(min(1 << 20, left + 1)):
            left -= len(chunk)
            if left < 0:
                raise ArchiveError(f"'{name}' entry '{info.filename}' lies about its size")
            out.write(chunk)
