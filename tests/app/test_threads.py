"""CPU threads per job thread: the process's CPUs shared among its worker threads, or
``CKA_CPU_THREADS``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from app.jobs import threads
from app.jobs.runtime import compose
from app.store.settings import Settings


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda _pid: {0, 5}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("CKA_CPU_THREADS", raising=False)


@pytest.fixture
def torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_cpus_are_shared_among_the_worker_threads(two_cpus: None, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert threads.available_cpus() == 2
    assert threads.cpu_threads(settings, workers=2) == 1
    assert threads.cpu_threads(settings, workers=1) == 2
    assert threads.cpu_threads(settings, workers=3) == 1  # never none
    assert threads.cpu_threads(settings, workers=0) == 2  # no worker: one thread of work


def test_the_setting_overrides(two_cpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # an environment that asks: heeded
    assert threads.cpu_threads(Settings(), workers=2) == 4
    monkeypatch.setenv("CKA_CPU_THREADS", "3")  # the setting wins over both
    assert threads.cpu_threads(Settings(), workers=2) == 3
    monkeypatch.setenv("CKA_CPU_THREADS", "0")
    with pytest.raises(ValidationError, match="cpu_threads"):
        Settings()


def test_a_starting_worker_sets_torchs_threads(
    two_cpus: None, torch_threads: None, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'cka.db'}", data_dir=tmp_path, worker_threads=2
    )
    from app.store.db import ensure_schema

    runtime = compose(settings)
    try:
        ensure_schema(runtime.services.db.engine)
        torch.set_num_threads(7)
        runtime.start()
        assert torch.get_num_threads() == 1
    finally:
        runtime.close()
