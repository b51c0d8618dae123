"""CPU threads for the jobs of a process: one place decides how many.

Torch runs each operation on a pool of intra-op threads, and the BLAS beneath numpy on one of
its own; left alone, each sizes its pool to the machine's cores — whatever CPUs this process
may use (a container's cpuset, ``taskset``) and however many jobs run at once. Every job thread
then spins that many threads on the same cores, beside every other process's: a training on a
shared 2-core machine ran 6–20× slower than its share of the CPU explains (issue 38).

:func:`cpu_threads` gives each job thread its share: the CPUs this process may run on
(``os.sched_getaffinity``) divided among its worker threads, at least one; ``CKA_CPU_THREADS``
overrides it, and so does an ``OMP_NUM_THREADS`` set in the environment.
:func:`limit_cpu_threads` sets torch's and the BLAS libraries' counts for the process; the
composition root (:mod:`app.jobs.runtime`) and the Celery worker call it when their workers
start (see BENCHMARKS.md for what it is worth on a busy machine). The libraries
(``models``, ``analysis``) never set thread counts.
"""

from __future__ import annotations

import os

import torch

# threadpoolctl: a dependency of scikit-learn (the built-in digits), so always installed.
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from app.store.settings import Settings

__all__ = ["available_cpus", "cpu_threads", "limit_cpu_threads"]


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def cpu_threads(settings: Settings, workers: int) -> int:
    """Intra-op threads for each of ``workers`` job threads of this process:
    ``CKA_CPU_THREADS`` when set, else ``OMP_NUM_THREADS`` when the environment sets it (as
    a Celery worker's launcher or a test does), else the available CPUs shared among the
    workers (at least one each)."""
    if settings.cpu_threads is not None:
        return settings.cpu_threads
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    return max(available_cpus() // max(workers, 1), 1)


def limit_cpu_threads(threads: int) -> None:
    """Size torch's intra-op pool and the BLAS pools (OpenBLAS, MKL, ...) of this process."""
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")
