"""Registering datasets (built-in and uploaded) in the database and the artifact store."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError

from analysis import DatasetError, DatasetTooLarge, describe_dataset
from app.store import repository
from app.store.orm import Dataset
from app.store.services import Services
from app.store.values import clean_name

__all__ = [
    "BUILTIN_DATASETS",
    "builtin_dataset",
    "builtin_datasets_known",
    "dataset_key",
    "register_builtin_datasets",
    "register_dataset_file",
]

# (name, load_dataset spec, split) of the datasets every installation has.
BUILTIN_DATASETS = (("digits", "digits", "test"),)

# What of an upload's file name may name its scratch copy (so messages name the user's file).
_SAFE_STEM = re.compile(r"[^A-Za-z0-9_.-]")


def _insert(services: Services, row: Dataset) -> tuple[Dataset, bool]:
    try:
        with services.db.session() as s:
            existing = repository.dataset_by_sha(s, row.sha256)
            if existing is not None:
                return existing, False
            s.add(row)
            s.flush()
            return row, True
    except IntegrityError:  # registered concurrently by another process
        with services.db.session(readonly=True) as s:
            found = repository.dataset_by_sha(s, row.sha256)
            assert found is not None
            return found, False


def _row(data: Any, **fields: Any) -> Dataset:
    return Dataset(
        sha256=data.sha256,
        n=len(data),
        shape=[int(v) for v in data.shape],
        classes=list(data.classes) if data.classes is not None else None,
        **fields,
    )


def register_builtin_datasets(services: Services) -> list[Dataset]:
    """Make sure every built-in dataset has a row (idempotent, safe across processes)."""
    out = []
    for name, spec, split in BUILTIN_DATASETS:
        data = services.datasets.get(f"builtin:{spec}:{split}")
        row = _row(data, name=name, builtin=True, spec=spec, split=split, size_bytes=0)
        out.append(_insert(services, row)[0])
    return out


def builtin_datasets_known(services: Services) -> bool:
    """Whether every built-in dataset has a row already, as on a store's second start (without
    loading them: :func:`register_builtin_datasets` loads each, to check its content)."""
    with services.db.session(readonly=True) as s:
        return all(
            repository.has_builtin_dataset(s, spec, split) for _, spec, split in BUILTIN_DATASETS
        )


def builtin_dataset(services: Services, spec: str) -> Dataset:
    """The row of built-in dataset ``spec``'s test split (e.g. ``digits-shifted``), added on
    first use: the datasets a study trains on are compared on their test split."""
    data = services.datasets.get(f"builtin:{spec}:test")
    row = _row(data, name=spec, builtin=True, spec=spec, split="test", size_bytes=0)
    return _insert(services, row)[0]


def sniff_suffix(path: Path, filename: str | None) -> str:
    """``.npz`` or ``.zip`` from the upload's declared name, else from its content."""
    declared = Path(filename or "").suffix.lower()
    if declared in (".npz", ".zip"):
        return declared
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        return ".npz" if names and all(n.endswith(".npy") for n in names) else ".zip"

    raise DatasetError("the dataset file must be an .npz archive or a .zip of an ImageFolder")


def register_dataset_file(
    services: Services, path: Path, *, filename: str | None, name: str | None
) -> tuple[Dataset, bool]:
    """Check an uploaded file as a job would read it, store it, and add its row.

    ``path`` is a scratch file the caller owns; it is renamed in place, then moved into the
    store. The check streams the file (:func:`analysis.data.datasets.describe_dataset`): this
    process never holds the images, whose float32 size is bounded by CKA_MAX_DATASET_BYTES;
    the first job that uses the dataset loads it.
    """
    suffix = sniff_suffix(path, filename)
    stem = _SAFE_STEM.sub("_", Path(filename or "").stem)[:100].strip("._") or "upload"
    typed = path.rename(path.with_name(f"{stem}{suffix}"))
    limit = services.settings.max_dataset_bytes
    try:
        data = describe_dataset(typed, max_decoded=limit)  # before anything is stored
    except DatasetTooLarge as exc:
        raise DatasetTooLarge(f"{str(exc)[:-1]} by CKA_MAX_DATASET_BYTES.") from None
    file_sha, size = services.store.put_file(typed, suffix)  # moved, not copied
    label = name or clean_name(Path(filename or "").stem) or clean_name(data.name) or "dataset"
    row = _row(
        data,
        name=label[:200],
        builtin=False,
        spec=None,
        split="all",
        file_sha256=file_sha,
        file_suffix=suffix,
        size_bytes=size,
    )
    return _insert(services, row)


def dataset_key(ds: Dataset) -> str:
    """The key of a dataset row in :attr:`Services.datasets`."""
    if ds.builtin:
        return f"builtin:{ds.spec}:{ds.split}"
    return f"file:{ds.file_sha256}{ds.file_suffix}"
