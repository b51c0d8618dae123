"""CPU threads for the jobs of a process: one place decides how many.

Torch runs each operation on a pool of intra-op threads, and the BLAS beneath numpy on one of
its own; left alone, each sizes its pool to the machine's cores — whatever CPUs this process
may use (a container's cpuset, ``taskset``), however many jobs run at once and whatever else
runs there. Every job thread then spins that many threads on the same cores, beside every other
process's: a training on a shared 2-core machine ran 6–20× slower than its share of the CPU
explains (issue 38).

The rule, for each job thread of a worker (see BENCHMARKS.md, "The demo zoo's threads"):

- **pinned**: ``CKA_CPU_THREADS``, else an ``OMP_NUM_THREADS`` set in the environment, is the
  count, always (no adaptation);
- **its share** (:func:`cpu_threads`): the CPUs this process may run on
  (``os.sched_getaffinity``) divided among its worker threads, at least one — the count where
  the system cannot say how busy its CPUs are (no ``/proc/stat``: macOS), and the most ever;
- **what is idle now** (:class:`JobThreads`): at each job's start, the CPUs of the affinity
  that *other* processes left idle over the interval since the last look — ``/proc/stat``'s
  busy jiffies of those CPUs minus this process's own CPU time (``os.times``), so the process
  never counts itself as a neighbour — shared among the worker threads, a CPU counting when at
  least half of it was idle; at least one, at most the share. Nothing sleeps to sample: the
  interval is the time between two looks (the worker's idle polls and its job starts); a look
  sooner than :data:`MIN_INTERVAL_S` after the last keeps the last decision. All CPU time
  of other processes counts as busy, a ``nice`` neighbour's and a hypervisor's steal included.

A job keeps the count it started with, not changed between a training's epochs nor a
comparison's batches: the weights a CPU training computes depend on its thread count (1 and 2
threads give other weights; the sidecar records the count as ``torch_threads``), so a training
is reproducible from its record only if the count does not change under it. Pin
``CKA_CPU_THREADS`` for the same weights whatever the machine's load.

:func:`start_job_threads` sets a worker's plan and its share when the worker starts (the
in-process worker :class:`app.jobs.embedded.EmbeddedWorker` and the Celery worker call it);
:func:`job_threads`, called by the thread that is about to run a job
(:func:`app.jobs.run.run_claimed`) or waits for one, looks again and sets torch's count for that
thread (torch keeps one per thread) and the BLAS libraries' count for the process. Without a
started plan it does nothing. The libraries (``models``, ``analysis``) never set thread counts.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# threadpoolctl: a dependency of scikit-learn (the built-in digits), so always installed.
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from app.store.settings import Settings

__all__ = [
    "MIN_INTERVAL_S",
    "CpuReading",
    "JobThreads",
    "available_cpus",
    "cpu_threads",
    "idle_threads",
    "job_threads",
    "limit_cpu_threads",
    "pinned_threads",
    "read_cpu",
    "start_job_threads",
    "stop_job_threads",
]

# A look this soon after the last one keeps the last decision: /proc/stat counts in ticks of
# 10 ms, so a shorter interval says little.
MIN_INTERVAL_S = 0.1

PROC_STAT = Path("/proc/stat")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def pinned_threads(settings: Settings) -> int | None:
    """The count the operator set: ``CKA_CPU_THREADS``, else ``OMP_NUM_THREADS`` when the
    environment sets it (as a Celery worker's launcher or a test does); None when neither."""
    if settings.cpu_threads is not None:
        return settings.cpu_threads
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    return None


def cpu_threads(settings: Settings, workers: int) -> int:
    """Intra-op threads for each of ``workers`` job threads of this process, from the machine
    alone: the pinned count when set (:func:`pinned_threads`), else the available CPUs shared
    among the workers (at least one each) — the share :class:`JobThreads` never exceeds."""
    pinned = pinned_threads(settings)
    if pinned is not None:
        return pinned
    return max(available_cpus() // max(workers, 1), 1)


def limit_cpu_threads(threads: int) -> None:
    """Size torch's intra-op pool (the calling thread's, and that of threads yet to run torch)
    and the BLAS pools (OpenBLAS, MKL, ...) of this process."""
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")


@dataclass(frozen=True)
class CpuReading:
    """One look at the CPUs of the affinity: their summed busy and total ticks since boot
    (``/proc/stat``), this process's own CPU time in the same ticks, and when (seconds)."""

    cpus: tuple[int, ...]
    busy: int
    total: int
    own: float
    at: float


def _parse_stat(text: str, cpus: Sequence[int]) -> tuple[int, int] | None:
    """(busy, total) ticks of ``cpus`` from /proc/stat's text; None when a CPU is missing.

    Fields: user nice system idle iowait irq softirq steal (guest time is already in user);
    idle and iowait are idle, the rest busy."""
    wanted = {f"cpu{i}" for i in cpus}
    busy = total = seen = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name not in wanted:
            continue
        ticks = [int(v) for v in rest.split()[:8]]
        if len(ticks) < 8:
            return None
        idle = ticks[3] + ticks[4]
        total += sum(ticks)
        busy += sum(ticks) - idle
        seen += 1
    return (busy, total) if seen == len(wanted) else None


def read_cpu(stat: Path = PROC_STAT) -> CpuReading | None:
    """Look at the CPUs now; None where the system does not say (no ``/proc/stat``, no affinity)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    try:
        text = stat.read_text()
    except OSError:
        return None
    parsed = _parse_stat(text, cpus)
    if parsed is None:
        return None
    times = os.times()
    own = (times.user + times.system) * os.sysconf("SC_CLK_TCK")
    return CpuReading(cpus, parsed[0], parsed[1], own, time.monotonic())


def idle_threads(before: CpuReading, after: CpuReading, share: int, workers: int) -> int:
    """Threads for each of ``workers`` job threads: the CPUs that other processes left idle
    between the two readings, shared among the workers (a CPU counts when at least half of it
    was idle); at least 1, at most ``share``."""
    total = after.total - before.total
    if total <= 0:
        return share
    others = max((after.busy - before.busy) - (after.own - before.own), 0.0)
    cpus = len(after.cpus)
    idle = cpus * (1.0 - min(others / total, 1.0))
    return min(max(int(idle / max(workers, 1) + 0.5), 1), share)


class JobThreads:
    """The CPU threads of a worker's job threads, looked at again whenever one asks.

    ``read`` gives a :class:`CpuReading` (default :func:`read_cpu`; None: the system cannot
    say, so the share stays); a test hands it made-up readings. Thread-safe: the readings are
    the process's, shared by its job threads; each thread's torch count is its own.
    """

    def __init__(
        self,
        settings: Settings,
        workers: int,
        read: Callable[[], CpuReading | None] | None = None,
        limit_blas: Callable[[int], None] | None = None,
    ) -> None:
        self.workers = max(workers, 1)
        self.pinned = pinned_threads(settings)
        self.share = cpu_threads(settings, workers)
        self.threads = self.share  # the latest decision
        self._read = read or read_cpu
        self._limit_blas = limit_blas or (lambda n: threadpool_limits(limits=n, user_api="blas"))
        self._blas: int | None = None
        self._lock = threading.Lock()
        self._last: CpuReading | None = None
        if self.pinned is None:
            self._last = self._read()

    def decide(self) -> int:
        """Look again and return the count for a job starting now (see the module's rule)."""
        if self.pinned is not None:
            return self.pinned
        now = self._read()
        with self._lock:
            if now is None:  # the system does not say: the share
                self.threads = self.share
            elif self._last is None or self._last.cpus != now.cpus:  # first look, new affinity
                self._last = now
            elif now.at - self._last.at >= MIN_INTERVAL_S:
                self.threads = idle_threads(self._last, now, self.share, self.workers)
                self._last = now
            # else too soon to say: the last decision stands, and the interval grows
            return self.threads

    def apply(self) -> int:
        """:meth:`decide`, then set the calling thread's torch count and, when it changed,
        the process's BLAS count; the count."""
        threads = self.decide()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        with self._lock:
            if self._blas != threads:
                self._limit_blas(threads)
                self._blas = threads
        return threads


_plan: JobThreads | None = None


def start_job_threads(settings: Settings, workers: int) -> JobThreads:
    """A worker starts with ``workers`` job threads: its plan, its share set for the process
    (threads that have yet to run torch take it), and the first look at the CPUs."""
    global _plan
    plan = JobThreads(settings, workers)
    limit_cpu_threads(plan.share)
    plan._blas = plan.share
    _plan = plan
    return plan


def stop_job_threads(plan: JobThreads) -> None:
    """The worker that started ``plan`` stopped: :func:`job_threads` no longer follows it."""
    global _plan
    if _plan is plan:
        _plan = None


def job_threads() -> int | None:
    """In the thread about to run a job (or waiting for one): look again and set its count
    (:meth:`JobThreads.apply`); None, and nothing set, when no worker of this process started."""
    plan = _plan
    return None if plan is None else plan.apply()
