"""CPU threads per job thread: the process's CPUs shared among its worker threads, of them
those its neighbours leave idle as each job starts, or ``CKA_CPU_THREADS``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
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


# -- the count that fits the machine now: fake looks at the CPUs --------------------------

HZ = 100  # ticks per second of the fake readings


class FakeCpus:
    """Looks at CPUs where other processes run ``others`` busy CPUs and this one ``own``,
    one second apart unless ``step`` says otherwise; counts the looks."""

    def __init__(self, others: float, own: float = 0.0, step: float = 1.0) -> None:
        self.others, self.own, self.step = others, own, step
        self.at, self.busy, self.spent, self.looks = 10.0, 0.0, 0.0, 0

    def __call__(self) -> threads.CpuReading:
        self.looks += 1
        self.at += self.step
        self.busy += (self.others + self.own) * self.step * HZ
        self.spent += self.own * self.step * HZ
        total = round(self.at * HZ * 2)
        return threads.CpuReading((0, 5), round(self.busy), total, self.spent, self.at)


def test_the_idle_cpus_of_the_share_are_used() -> None:
    share, one = 2, 1
    before = threads.CpuReading((0, 5), busy=1000, total=4000, own=300.0, at=20.0)

    def after(others: float, own: float) -> threads.CpuReading:  # one second later, 2 CPUs
        return threads.CpuReading(
            (0, 5),
            busy=1000 + round((others + own) * HZ),
            total=4200,
            own=300.0 + own * HZ,
            at=21.0,
        )

    assert threads.idle_threads(before, after(0.0, 0.0), share, one) == 2  # nobody else
    assert threads.idle_threads(before, after(2.0, 0.0), share, one) == 1  # both held: never 0
    assert threads.idle_threads(before, after(1.0, 1.0), share, one) == 1  # one neighbour
    # the process's own time is not a neighbour's: itself busy on both, the share stays
    assert threads.idle_threads(before, after(0.0, 2.0), share, one) == 2
    assert threads.idle_threads(before, after(0.4, 1.5), share, one) == 2  # 1.6 idle: counts
    assert threads.idle_threads(before, after(0.6, 1.0), share, one) == 1  # 1.4 idle: one
    # shared among the workers, never above the share
    assert threads.idle_threads(before, after(0.0, 0.0), 1, 2) == 1
    assert threads.idle_threads(before, after(0.0, 0.0), 1, 1) == 1


def test_proc_stat_is_read_for_the_cpus_of_the_affinity(two_cpus: None, tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 900 900 0 0 0 0 0 0\n"  # the whole machine: not what is asked
        "cpu0 100 20 30 400 50 1 2 3 0 0\n"  # busy 156, idle 450
        "cpu3 999 0 999 999 0 0 0 0 0 0\n"  # not this process's
        "cpu5 10 0 5 300 0 0 0 1 7 0\n"  # busy 16 (steal 1; guest 7 is already in user)
        "intr 12 0 0\n"
    )
    look = threads.read_cpu(stat)
    assert look is not None
    assert (look.cpus, look.busy, look.total) == ((0, 5), 172, 172 + 750)
    assert threads.read_cpu(tmp_path / "missing") is None  # no /proc/stat (macOS)
    stat.write_text("cpu0 1 2 3 4 5 6 7 8 0 0\n")  # cpu5 missing: nothing to say
    assert threads.read_cpu(stat) is None


def test_a_job_starts_on_the_cpus_its_neighbours_left(two_cpus: None) -> None:
    busy = FakeCpus(others=2.0)
    plan = threads.JobThreads(Settings(), workers=1, read=busy, limit_blas=lambda _n: None)
    assert plan.share == 2 and plan.threads == 2  # nothing measured yet: the share
    assert plan.decide() == 1
    busy.others = 0.0  # the neighbour is gone
    assert plan.decide() == 2
    busy.others = 1.0
    assert plan.decide() == 1


def test_a_look_too_soon_keeps_the_last_decision(two_cpus: None) -> None:
    cpus = FakeCpus(others=2.0)
    plan = threads.JobThreads(Settings(), workers=1, read=cpus, limit_blas=lambda _n: None)
    assert plan.decide() == 1
    cpus.others, cpus.step = 0.0, 0.01  # gone, but 10 ms say too little
    assert plan.decide() == 1
    for _ in range(30):  # 0.3 s of an idle machine since the last decision: that counts
        plan.decide()
    assert plan.decide() == 2


def test_no_proc_stat_keeps_the_static_rule(two_cpus: None, tmp_path: Path) -> None:
    plan = threads.JobThreads(
        Settings(),
        workers=1,
        read=partial(threads.read_cpu, tmp_path / "missing"),
        limit_blas=lambda _n: None,
    )
    assert plan.decide() == 2 == threads.cpu_threads(Settings(), workers=1)
    plan = threads.JobThreads(Settings(), workers=2, read=lambda: None)
    assert plan.decide() == 1 == threads.cpu_threads(Settings(), workers=2)


def test_a_pinned_count_never_adapts(two_cpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    busy = FakeCpus(others=2.0)
    monkeypatch.setenv("CKA_CPU_THREADS", "2")
    plan = threads.JobThreads(Settings(), workers=1, read=busy)
    assert [plan.decide() for _ in range(3)] == [2, 2, 2] and busy.looks == 0
    monkeypatch.delenv("CKA_CPU_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    plan = threads.JobThreads(Settings(), workers=1, read=busy)
    assert [plan.decide() for _ in range(3)] == [2, 2, 2] and busy.looks == 0


def test_each_job_runs_on_the_threads_decided_as_it_starts(
    two_cpus: None, torch_threads: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's job thread sets its own torch count (torch keeps one per thread) as each
    job starts, from what the neighbours leave idle."""
    from app.jobs import run
    from app.jobs.queue import enqueue
    from app.store.db import ensure_schema

    cpus = FakeCpus(others=2.0)
    monkeypatch.setattr(threads, "read_cpu", cpus)
    seen: list[tuple[int, str]] = []
    done = threading.Semaphore(0)

    def handler(_services: object, _job: object, _control: object) -> None:
        seen.append((torch.get_num_threads(), threading.current_thread().name))
        cpus.others = 0.0  # the neighbour leaves while the first job runs
        done.release()

    monkeypatch.setitem(run.HANDLERS, "training", handler)
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'cka.db'}", data_dir=tmp_path, poll_s=0.05
    )
    runtime = compose(settings, threads=1)
    try:
        ensure_schema(runtime.services.db.engine)
        with runtime.services.db.session() as s:
            enqueue(s, "training")  # both queued: the worker takes one after the other
            enqueue(s, "training")
        runtime.start()
        assert done.acquire(timeout=60) and done.acquire(timeout=60)  # give-up limits
    finally:
        runtime.close()
    assert [n for n, _ in seen] == [1, 2]
    assert all(name != threading.current_thread().name for _, name in seen)
    assert threads.job_threads() is None  # the worker stopped: nothing follows its plan


def test_a_jobs_photos_are_decoded_on_its_threads(
    two_cpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding a dataset's photos takes as many threads as the job thread's count, which the
    plan sets from ``CKA_CPU_THREADS`` (pinned here to 3) or the idle share."""
    from analysis.data import decoded

    monkeypatch.setenv("CKA_CPU_THREADS", "3")
    plan = threads.JobThreads(Settings(), workers=1, limit_blas=lambda _n: None)
    seen: list[int] = []

    def job() -> None:
        plan.apply()  # as app.jobs.run does in the thread that runs a job
        seen.append(decoded.decode_threads())

    worker = threading.Thread(target=job)
    worker.start()
    worker.join()
    assert seen == [3]
