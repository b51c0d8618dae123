"""Content-addressed artifact store under ``CKA_DATA_DIR``.

Blobs live at ``blobs/<sha[:2]>/<sha><suffix>`` where ``sha`` is the sha256 of the content
and ``suffix`` comes from a fixed whitelist: no user-supplied name ever becomes a path.
Writes go to a temporary file in the same filesystem and are renamed into place, so a
reader never sees half a file and a crash leaves at most an orphaned temporary file.

A store that cannot be written (a read-only or full filesystem, missing permissions) raises
:class:`StoreError`, whose message is one sentence naming the store and the reason; jobs
record that sentence as their error. An upload takes its size in the store once: it is
spooled into the store's scratch space (refused at once when it cannot fit:
:meth:`ArtifactStore.check_room`), checked there, and renamed into its content address
(:meth:`ArtifactStore.put_file`), never copied.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from safetensors import SafetensorError

__all__ = ["SUFFIXES", "ArtifactStore", "StoreError", "StoreGramCache", "TooLarge"]

log = logging.getLogger(__name__)

SUFFIXES = frozenset(
    {"", ".safetensors", ".json", ".npz", ".zip", ".png", ".svg", ".csv", ".parquet"}
)
_SHA = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class TooLarge(ValueError):
    """A stream exceeded the size limit while being written to the store."""


class StoreError(OSError):
    """The artifact store cannot be written; ``str()`` is a sentence saying where and why.

    Reported as ``storage_error``: 507 Insufficient Storage when the store is full, else 503.
    """

    code = "storage_error"

    @property
    def status(self) -> int:
        return 507 if self.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else 503

    def __str__(self) -> str:
        return str(self.strerror)  # the sentence alone, without OSError's "[Errno n]" prefix


_OS_ERROR = re.compile(r"os error (\d+)")  # how safetensors' Rust I/O errors carry errno
_FULL = {errno.ENOSPC, errno.EDQUOT}
_NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


def _errno(exc: BaseException) -> int | None:
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    found = _OS_ERROR.search(str(exc))
    return int(found.group(1)) if found else None


def store_error(root: Path, exc: BaseException) -> StoreError | None:
    """The :class:`StoreError` for a failed write under ``root``, or None if not an I/O error."""
    code = _errno(exc)
    if isinstance(exc, StoreError) or (code is None and not isinstance(exc, OSError)):
        return None
    if code in _FULL:
        text = f"no space left on the artifact store at {root}; free some space and try again"
    elif code == errno.EFBIG:
        text = (
            f"the artifact store at {root} refused to grow a file (file size limit "
            "exceeded); raise the limit or free some space and try again"
        )
    elif code in _NOT_WRITABLE:
        reason = "read-only file system" if code == errno.EROFS else "permission denied"
        text = (
            f"the artifact store at {root} is not writable ({reason}); make it writable or "
            "point CKA_DATA_DIR elsewhere"
        )
    else:
        detail = os.strerror(code) if code is not None else str(exc)
        text = f"the artifact store at {root} could not be written ({detail})"
    return StoreError(code or errno.EIO, text)


def _amount(nbytes: int) -> str:
    return f"{nbytes} bytes" if nbytes < 1 << 20 else f"{nbytes / (1 << 20):.1f} MiB"


class ArtifactStore:
    """Blobs, Gram cache, decoded images and scratch space under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.grams = self.root / "grams"
        self.decoded = self.root / "decoded"
        self.tmp = self.root / "tmp"
        with self.writing():
            for d in (self.blobs, self.grams, self.decoded, self.tmp):
                d.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Turn an I/O error raised inside the block into a :class:`StoreError` sentence."""
        try:
            yield
        except Exception as exc:
            err = store_error(self.root, exc)
            if err is None:
                raise
            raise err from exc

    def path(self, sha: str, suffix: str = "") -> Path:
        """Where the blob ``sha`` lives (it may not exist)."""
        if not _SHA.match(sha):
            raise ValueError(f"not a sha256 hex digest: {sha!r}")
        if suffix not in SUFFIXES:
            raise ValueError(f"artifact suffix {suffix!r} is not allowed")
        return self.blobs / sha[:2] / f"{sha}{suffix}"

    def exists(self, sha: str, suffix: str = "") -> bool:
        return self.path(sha, suffix).is_file()

    def put_bytes(self, data: bytes, suffix: str = "") -> str:
        """Store ``data``; returns its sha256."""
        return self.put_chunks([data], suffix)[0]

    def put_stream(
        self, stream: BinaryIO, suffix: str = "", limit: int | None = None
    ) -> tuple[str, int]:
        """Store a readable binary stream; returns (sha256, size). Raises TooLarge past limit."""
        return self.put_chunks(iter(lambda: stream.read(_CHUNK), b""), suffix, limit)

    def put_chunks(
        self, chunks: Iterable[bytes], suffix: str = "", limit: int | None = None
    ) -> tuple[str, int]:
        digest = hashlib.sha256()
        size = 0
        with self.writing():
            fd, tmp_name = tempfile.mkstemp(dir=self.tmp, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise TooLarge(f"upload exceeds the limit of {limit} bytes")
                    digest.update(chunk)
                    with self.writing():
                        f.write(chunk)
                with self.writing():
                    f.flush()
                    os.fsync(f.fileno())
            sha = digest.hexdigest()
            self.place(Path(tmp_name), sha, suffix)
            return sha, size
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def put_file(self, path: Path, suffix: str = "") -> tuple[str, int]:
        """Move ``path`` (a file in :attr:`tmp`, e.g. a scratch upload) into its content
        address; returns (sha256, size). A rename on the same filesystem: no copy is made."""
        digest = hashlib.sha256()
        size = 0
        with self.writing(), path.open("rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                digest.update(chunk)
                size += len(chunk)
            os.fsync(f.fileno())
        sha = digest.hexdigest()
        self.place(path, sha, suffix)
        return sha, size

    def link_or_copy(self, source: Path, dest: Path) -> None:
        """``dest`` with the content of ``source``: a hard link when ``source`` lies in the
        store (a scratch upload, a blob, neither ever written again), else a copy."""
        with self.writing():
            inside = source.resolve().is_relative_to(self.root.resolve())
            try:
                if inside:
                    os.link(source, dest)
                    return
            except OSError as exc:  # a filesystem without hard links: copy instead
                if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP):
                    raise
            shutil.copyfile(source, dest)

    def free_bytes(self) -> int:
        """Bytes the store's filesystem has free for it."""
        with self.writing():
            return shutil.disk_usage(self.tmp).free

    def check_room(self, nbytes: int, what: str) -> None:
        """Refuse (507) to write ``nbytes`` of ``what`` that cannot fit, before a byte is
        written: a store filled to its last block fails every other writer too."""
        free = self.free_bytes()
        if nbytes > free:
            raise StoreError(
                errno.ENOSPC,
                f"{what} needs {_amount(nbytes)} and the artifact store at {self.root} has "
                f"{_amount(free)} free; free some space (`cka-atlas gc`, or delete what is no "
                "longer needed) and try again",
            )

    def place(self, tmp: Path, sha: str, suffix: str = "") -> Path:
        """Atomically move a finished temporary file into its content address."""
        dest = self.path(sha, suffix)
        with self.writing():
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        return dest

    def put_as(self, data: bytes, sha: str, suffix: str) -> Path:
        """Store ``data`` under an address derived from another blob (e.g. a sidecar)."""
        with self.writing():
            fd, tmp_name = tempfile.mkstemp(dir=self.tmp, suffix=".part")
        try:
            with self.writing(), os.fdopen(fd, "wb") as f:
                f.write(data)
            return self.place(Path(tmp_name), sha, suffix)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def put_once(self, data: bytes, sha: str, suffix: str) -> bytes | None:
        """Store ``data`` under ``sha`` only if nothing is there yet; never replaces a file.

        Returns None when ``data`` was placed, else the bytes already stored (a hard link
        places the file, so of two concurrent writers exactly one wins).
        """
        dest = self.path(sha, suffix)
        with self.writing():
            fd, tmp_name = tempfile.mkstemp(dir=self.tmp, suffix=".part")
        try:
            with self.writing():
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(tmp_name, dest)
                except FileExistsError:
                    return dest.read_bytes()
            return None
        finally:
            Path(tmp_name).unlink(missing_ok=True)

    def scratch(self) -> tempfile.TemporaryDirectory[str]:
        """A private temporary directory on the store's filesystem, removed on exit."""
        with self.writing():
            return tempfile.TemporaryDirectory(dir=self.tmp)

    def delete(self, sha: str, suffix: str = "") -> None:
        self.path(sha, suffix).unlink(missing_ok=True)

    def relative(self, sha: str, suffix: str = "") -> str:
        """The blob's path relative to the store's root (how references name it)."""
        return self.path(sha, suffix).relative_to(self.root).as_posix()


class StoreGramCache:
    """The engine's Gram cache under ``store.grams``, with the store's error sentences.

    A stored Gram that cannot be read (damaged by hand, say) counts as a miss and is
    recomputed; a Gram that cannot be written fails the job with a :class:`StoreError`.
    ``touched`` collects the store-relative paths of every Gram and block read or written,
    which the comparison records as its references (see :mod:`app.store.gc`).
    """

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        # imported here: the store's other users (``cka-atlas gc``, ``db``) need no torch
        from analysis.engine.gram_cache import DirectoryGramCache

        self._inner = DirectoryGramCache(store.grams)
        self.touched: set[str] = set()

    def relative(self, key: str) -> str:
        """Where ``key`` lives, relative to the store's root."""
        return self._inner._path(key).relative_to(self.store.root).as_posix()

    def get(self, key: str) -> np.ndarray | None:
        try:
            value = self._inner.get(key)
        except (OSError, SafetensorError) as exc:
            log.warning("stored Gram %s is unreadable (%s); recomputing it", key[:12], exc)
            return None
        if value is not None:
            self.touched.add(self.relative(key))
        return value

    def put(self, key: str, grams: Any) -> None:
        with self.store.writing():
            self._inner.put(key, grams)
        self.touched.add(self.relative(key))


class StoreDecodedCache:
    """Image files' pixels, decoded once per pipeline (:mod:`analysis.data.decoded`), under
    ``store.decoded``: ``.npy`` files read memory-mapped, shared by every worker of the store.

    Kept like stored Grams: each path read or written joins ``touched`` (the job's references,
    shared with its :class:`StoreGramCache`), so deleting the comparisons that used them
    removes them and ``cka-atlas gc`` collects the orphans. Bounded by the store's free space:
    pixels that would not fit are not kept (a warning; the comparison decodes them in memory
    and the next one decodes them again), and an unreadable file counts as a miss.
    """

    def __init__(self, store: ArtifactStore, touched: set[str] | None = None) -> None:
        self.store = store
        from analysis.data.decoded import DirectoryDecodedCache  # torch only where it runs

        self._inner = DirectoryDecodedCache(store.decoded)
        self.touched: set[str] = touched if touched is not None else set()

    def relative(self, key: str) -> str:
        """Where ``key`` lives, relative to the store's root."""
        return self._inner.path(key).relative_to(self.store.root).as_posix()

    def get(self, key: str) -> np.ndarray | None:
        try:
            value = self._inner.get(key)
        except (OSError, ValueError) as exc:
            log.warning("decoded images %s are unreadable (%s); decoding again", key[:12], exc)
            return None
        if value is not None:
            self.touched.add(self.relative(key))
        return value

    def put(self, key: str, pixels: np.ndarray) -> None:
        try:
            self.store.check_room(int(pixels.nbytes), "the decoded images")
            with self.store.writing():
                self._inner.put(key, pixels)
        except StoreError as exc:
            log.warning("decoded images %s not kept: %s", key[:12], exc)
            return
        self.touched.add(self.relative(key))
