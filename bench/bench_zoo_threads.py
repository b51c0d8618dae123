"""How long the demo zoo trains, idle and beside a busy neighbour, per torch thread count.

Each run is a fresh child process that trains the zoo's six models (``models.training.ZOO``)
on the digits with ``--epochs`` epochs each (default 1: the quick zoo; ``--epochs 0`` gives each
preset its recipe, the demo itself) into a temporary folder and reports the seconds. The child
sets its thread counts as a worker of the service would (``app.jobs.threads``):

- ``before``: nothing set, torch's own default (the machine's cores, whatever else runs) and
  libgomp's own spin (an idle pool thread spins 300,000 rounds before it sleeps);
- ``static``: :func:`app.jobs.threads.cpu_threads` for the process's worker threads
  (``--workers``, default 1, as ``make run``) or ``CKA_CPU_THREADS``, and the shorter spin
  ``app`` sets (``GOMP_SPINCOUNT=10000``), as every row below does — issue 38's first rule;
- ``adaptive``: what a worker of the service does now: :func:`app.jobs.threads.start_job_threads`
  once, then :meth:`~app.jobs.threads.JobThreads.apply` as each model's training starts (each is
  a job of the demo), so each trains on the CPUs its neighbours left idle;
- ``N``: exactly N threads (``--threads 1 2``).

"Busy" runs beside a neighbour that keeps every CPU of this process's affinity busy: one
child process per CPU spinning in pure Python (what a test suite or another job does to the
cores), started before and stopped after the zoo. Each configuration runs ``--repeats`` times;
the runs alternate (every configuration idle and busy, then again), and the medians are
printed as a markdown table; the torch threads column gives each run's counts (per model for
``adaptive``).

The timing is the child's own: its wall and CPU seconds around the zoo's training (what
:func:`harness.interleaved` would read, but without the interpreter's start and the
neighbour's, which a clock around the child would count), kept as :class:`harness.Timed` runs
for the medians, the machine line and ``--json PATH``; so the rounds are this script's loop,
in the same order ``interleaved`` keeps (every job once, then again), with no warm-up (each run
is a fresh process).

    nice -n 10 .venv/bin/python bench/bench_zoo_threads.py                 # quick zoo
    nice -n 10 .venv/bin/python bench/bench_zoo_threads.py --epochs 0      # the full recipes
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import harness  # bench/harness.py, beside this script

ROOT = Path(__file__).resolve().parents[1]


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


@contextmanager
def busy_neighbour(cpus: int) -> Iterator[None]:
    """One spinning process per CPU until the block ends."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(cpus)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # all spinning before the zoo starts
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(10)


def child(threads: str, epochs: int, workers: int) -> None:
    """Train the zoo once with ``threads`` (before / static / adaptive / a number); print the
    wall and CPU seconds and the torch threads each model trained with."""
    import torch

    from analysis import training_data
    from app.jobs.threads import cpu_threads, limit_cpu_threads, start_job_threads
    from app.store.settings import Settings
    from models.training import ZOO, train

    plan = None
    if threads == "static":
        limit_cpu_threads(cpu_threads(Settings(), workers))
    elif threads == "adaptive":
        plan = start_job_threads(Settings(), workers)  # as the worker starts
    elif threads != "before":
        limit_cpu_threads(int(threads))
    data = training_data("digits")
    used = []
    began, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as out:
        for name, arch, seed in ZOO:
            if plan is not None:
                plan.apply()  # as each job starts
            used.append(torch.get_num_threads())
            train(arch, data, seed=seed, out_dir=out, name=name, epochs=epochs or None)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    print(f"{wall:.2f} {cpu:.2f} {''.join(map(str, used))}")


def run_once(threads: str, epochs: int, workers: int) -> tuple[float, float, str]:
    """One fresh child's training of the zoo: its wall and CPU seconds, its threads."""
    command = [sys.executable, __file__, "--child", threads, "--epochs", str(epochs)]
    command += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if threads == "before":  # as before issue 38: libgomp's own spin before a thread sleeps
        env.pop("GOMP_SPINCOUNT", None)
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    wall, cpu, used = out.split()[-3:]
    return float(wall), float(cpu), used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=1, help="per model; 0: the recipes")
    parser.add_argument("--workers", type=int, default=1, help="worker threads for 'after'")
    parser.add_argument("--threads", nargs="*", default=[], help="fixed counts to add")
    parser.add_argument(
        "--configs",
        nargs="*",
        default=["before", "static", "adaptive"],
        help="the rule-based rows to run (before, static, adaptive)",
    )
    harness.options(parser, repeat=1, clock=None, threads=None)
    args = harness.parse(parser)
    if args.child is not None:
        child(args.child, args.epochs, args.workers)
        return
    from app.jobs.threads import available_cpus

    cpus = available_cpus()
    print(
        f"zoo at {args.epochs or 'recipe'} epoch(s) per model, {args.repeat} run(s) each; "
        f"{harness.machine_line()}",
        file=sys.stderr,
    )
    configs = [*args.configs, *args.threads]
    times = {(c, b): harness.Timed() for c in configs for b in ("idle", "busy")}
    counts: dict[str, set[str]] = {c: set() for c in configs}
    for _ in range(args.repeat):
        for (threads, busy), timed in times.items():
            if busy == "busy":
                with busy_neighbour(cpus):
                    wall, cpu, used = run_once(threads, args.epochs, args.workers)
            else:
                wall, cpu, used = run_once(threads, args.epochs, args.workers)
            timed.wall.append(wall)
            timed.cpu.append(cpu)
            counts[threads].add(used)
            print(
                f"  {threads} {busy}: {wall:.1f} s (threads {used}; load average "
                f"{os.getloadavg()[0]:.2f})",
                file=sys.stderr,
            )
    print("| threads | torch threads | idle s | beside a busy neighbour s | busy / idle |")
    print("|---|---:|---:|---:|---:|")
    for threads in configs:
        idle, busy_s = (times[threads, b].stat("wall") for b in ("idle", "busy"))
        used = ", ".join(sorted(counts[threads]))
        print(f"| {threads} | {used} | {idle:.1f} | {busy_s:.1f} | {busy_s / idle:.1f}× |")
    figures = {"epochs": args.epochs, "threads_used": {c: sorted(u) for c, u in counts.items()}}
    harness.finish(args.json, figures, {f"{c} {b}": t for (c, b), t in times.items()})


if __name__ == "__main__":
    main()
