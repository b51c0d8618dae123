"""How long the demo zoo trains, idle and beside a busy neighbour, per torch thread count.

Each run is a fresh child process that trains the zoo's six models (``models.training.ZOO``)
on the digits with ``--epochs`` epochs each (default 1: the quick zoo; ``--epochs 0`` gives each
preset its recipe, the demo itself) into a temporary folder and reports the seconds. The child
sets its thread counts as a worker of the service would (``app.jobs.threads``):

- ``before``: nothing set, torch's own default (the machine's cores, whatever else runs) and
  OpenMP's own wait policy (idle pool threads spin for a while before they sleep);
- ``after``: :func:`app.jobs.threads.cpu_threads` for the process's worker threads
  (``--workers``, default 1, as ``make run``) or ``CKA_CPU_THREADS``, and the passive wait
  policy ``app`` sets (``OMP_WAIT_POLICY=PASSIVE``), as every row below does;
- ``N``: exactly N threads (``--threads 1 2``).

"Busy" runs beside a neighbour that keeps every CPU of this process's affinity busy: one
child process per CPU spinning in pure Python (what a test suite or another job does to the
cores), started before and stopped after the zoo. Each configuration runs ``--repeats`` times;
the medians are printed as a markdown table.

    nice -n 10 .venv/bin/python bench/bench_zoo_threads.py                 # quick zoo
    nice -n 10 .venv/bin/python bench/bench_zoo_threads.py --epochs 0      # the full recipes
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    """Train the zoo once with ``threads`` (before / after / a number); print the seconds."""
    import torch

    from analysis import training_data
    from app.jobs.threads import cpu_threads, limit_cpu_threads
    from app.store.settings import Settings
    from models.training import ZOO, train

    if threads == "after":
        limit_cpu_threads(cpu_threads(Settings(), workers))
    elif threads != "before":
        limit_cpu_threads(int(threads))
    data = training_data("digits")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        for name, arch, seed in ZOO:
            train(arch, data, seed=seed, out_dir=out, name=name, epochs=epochs or None)
    print(f"{time.perf_counter() - began:.2f} {torch.get_num_threads()}")


def run_once(threads: str, epochs: int, workers: int) -> tuple[float, int]:
    command = [sys.executable, __file__, "--child", threads, "--epochs", str(epochs)]
    command += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if threads == "before":  # as before issue 38: OpenMP's own wait policy (threads spin)
        env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    seconds, used = out.split()[-2:]
    return float(seconds), int(used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=1, help="per model; 0: the recipes")
    parser.add_argument("--workers", type=int, default=1, help="worker threads for 'after'")
    parser.add_argument("--threads", nargs="*", default=[], help="fixed counts to add")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.epochs, args.workers)
        return
    from app.jobs.threads import available_cpus

    cpus = available_cpus()
    print(
        f"{cpus} CPUs, zoo at {args.epochs or 'recipe'} epoch(s) per model, "
        f"{args.repeats} run(s) each",
        file=sys.stderr,
    )
    rows = []
    for threads in ["before", "after", *args.threads]:
        for busy in (False, True):
            times = []
            for _ in range(args.repeats):
                if busy:
                    with busy_neighbour(cpus):
                        seconds, used = run_once(threads, args.epochs, args.workers)
                else:
                    seconds, used = run_once(threads, args.epochs, args.workers)
                times.append(seconds)
                print(
                    f"  {threads} {'busy' if busy else 'idle'}: {seconds:.1f} s ({used} threads)",
                    file=sys.stderr,
                )
            rows.append((threads, used, busy, statistics.median(times)))
    print("| threads | torch threads | idle s | beside a busy neighbour s | busy / idle |")
    print("|---|---:|---:|---:|---:|")
    for i in range(0, len(rows), 2):
        (threads, used, _, idle), (_, _, _, busy) = rows[i], rows[i + 1]
        print(f"| {threads} | {used} | {idle:.1f} | {busy:.1f} | {busy / idle:.1f}× |")


if __name__ == "__main__":
    main()
