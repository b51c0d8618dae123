"""The process-wide services a request or a job needs, built once from :class:`Settings`.

Holds the database, the artifact store, and LRU caches of loaded checkpoints and datasets
(a checkpoint is loaded once per process and leased to one job at a time, because
activation extraction may attach hooks to the module). ``dispatch`` hands a new job to
whichever worker runs jobs in this deployment: the in-process pool or Celery.

A process builds its services once, in :func:`app.jobs.runtime.compose` (the composition
root, which chooses the dispatch and attaches the worker), and never changes them after:
:class:`Services` is a frozen dataclass, so a reassignment fails under mypy and at run time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from cachetools import LRUCache

from analysis import load_dataset
from app.store.artifacts import ArtifactStore
from app.store.checkpoints import load_checkpoint
from app.store.db import Database
from app.store.settings import Settings

__all__ = ["LRU", "Services", "nowhere", "resolve_device"]


def resolve_device(name: str) -> str:
    """``auto`` becomes ``cuda`` when a GPU is visible, else ``cpu``."""
    if name != "auto":
        return name

    return "cuda" if torch.cuda.is_available() else "cpu"


class LRU:
    """A thread-safe LRU (cachetools) of loaded objects, each with its own lease lock."""

    def __init__(self, size: int, load: Callable[[str], Any]) -> None:
        self.size = size
        self._load = load
        self._items: LRUCache[str, tuple[Any, threading.Lock]] = LRUCache(maxsize=size)
        self._lock = threading.Lock()
        self.loads = 0

    def _entry(self, key: str) -> tuple[Any, threading.Lock]:
        with self._lock:
            entry = self._items.get(key)
        if entry is not None:
            return entry
        value = self._load(key)  # outside the lock: loading may take a while
        with self._lock:
            entry = self._items.get(key)
            if entry is None:
                self.loads += 1
                entry = self._items[key] = (value, threading.Lock())
            return entry

    def get(self, key: str) -> Any:
        return self._entry(key)[0]

    @contextmanager
    def lease(self, keys: list[str]) -> Iterator[dict[str, Any]]:
        """Exclusive use of several entries; locks are taken in sorted order (no deadlock)."""
        with ExitStack() as stack:
            out: dict[str, Any] = {}
            for key in sorted(set(keys)):
                value, lock = self._entry(key)
                stack.enter_context(lock)
                out[key] = value
            yield out


def nowhere(_job_id: int) -> None:
    """The dispatch of a process that runs no jobs and tells no worker: a new job waits in the
    database for a worker that polls it (``cka-atlas worker``, a server's embedded pool)."""


@dataclass(frozen=True, eq=False, init=False, repr=False)  # repr: settings hold secrets
class Services:
    """Settings, database, artifact store and caches shared by the API and the workers."""

    settings: Settings
    db: Database
    store: ArtifactStore
    device: str
    models: LRU
    datasets: LRU
    dispatch: Callable[[int], None]

    def __init__(
        self,
        settings: Settings,
        db: Database | None = None,
        *,
        dispatch: Callable[[int], None] = nowhere,
    ) -> None:
        fields = {
            "settings": settings,
            "db": db or Database(settings.resolved_database_url),
            "store": ArtifactStore(settings.data_dir),
            "device": resolve_device(settings.device),
            "models": LRU(settings.model_cache_size, self._load_model),
            "datasets": LRU(4, self._load_dataset),
            "dispatch": dispatch,
        }
        for name, value in fields.items():  # the frozen dataclass's own way to set its fields
            object.__setattr__(self, name, value)

    def _load_model(self, sha: str) -> Any:
        model, _meta = load_checkpoint(self.store, sha)
        return model.eval().to(self.device)

    def _load_dataset(self, key: str) -> Any:
        """``key`` is ``builtin:<spec>:<split>`` or ``file:<sha><suffix>``."""
        kind, _, rest = key.partition(":")
        if kind == "builtin":
            spec, _, split = rest.partition(":")
            return load_dataset(spec, split=split)
        sha, suffix = rest[:64], rest[64:]
        return load_dataset(self.store.path(sha, suffix))

    def close(self) -> None:
        self.db.dispose()
