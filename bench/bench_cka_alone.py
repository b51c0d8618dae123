"""CKA alone, timed for one source tree: bench_engine.py's two ratios and the demo atlas, for
putting a tree beside the one before it.

The jobs (``--jobs``), in interleaved rounds after a warm-up each (:mod:`harness`):

- ``engine``: bench_engine.py's 2-model job (an 8-block MLP-Mixer and gMLP, every block, batches
  of 256) over ``--n`` random images (512, as ``bench_engine.py --quick``) and the bare forward
  passes of the same batches, whose ratio is P1; and its six-model atlas (three Mixers, three
  gMLPs) over six bare forward passes. Without its pytorch-cka columns, so it runs without the
  ``bench`` extra. (This was ``bench/bench_engine_ratios.py``.)
- ``demo``: the demo atlas, bench_measures.py's first row — the six untrained demo models over
  digits' 450 test images in batches of 150 at default options. (This was
  ``bench/bench_cka_alone.py`` alone, which printed its median CPU time.)

Each job's median and range in wall and in CPU time are printed, then the ratios of the
medians. ``--tree DIR`` imports DIR's ``analysis`` and its ``bench/bench_engine.py`` (without
it, whatever ``PYTHONPATH`` gives). Run it alternately on two trees (an export of the old commit
and the working tree) and compare the medians:

    git archive <old> | tar -x -C /tmp/old
    for k in 1 2 3; do for t in /tmp/old .; do
        PYTHONPATH=$t .venv/bin/python bench/bench_cka_alone.py --tree $t; done; done
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script

JOBS = ("engine", "demo")


def engine_jobs(n: int) -> dict[str, Callable[[], Any]]:
    """bench_engine.py's bare and CKA runs of its 2-model job and six-model atlas."""
    from bench_engine import bare, gmlp, images, mixer, ours

    x = images(n)
    two = {"mixer": mixer(0), "gmlp": gmlp(0)}
    six = {f"mixer{s}": mixer(s) for s in range(3)} | {f"gmlp{s}": gmlp(s) for s in range(3)}
    return {
        "bare2": lambda: bare(list(two.values()), x),
        "ours2": lambda: ours(two, x),
        "bare6": lambda: bare(list(six.values()), x),
        "ours6": lambda: ours(six, x),
    }


def demo_job() -> Callable[[], Any]:
    """The demo atlas at default options."""
    from workloads import demo_models

    import analysis

    nets, data = demo_models(), analysis.load_dataset("digits")
    return lambda: analysis.compare(nets, data, batch_size=150, device="cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, help="the source tree to time (default: PYTHONPATH's)")
    ap.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    ap.add_argument("--n", type=int, default=512, help="images of the engine jobs")
    harness.options(ap, repeat=3, clock=None)
    args = harness.parse(ap)
    if args.tree is not None:
        tree = str(args.tree.resolve())
        sys.path[:0] = [tree, f"{tree}/bench"]  # that tree's analysis and bench_engine
    import analysis

    jobs: dict[str, Callable[[], Any]] = {}
    if "engine" in args.jobs:
        jobs |= engine_jobs(args.n)
    if "demo" in args.jobs:
        jobs["demo atlas"] = demo_job()
    timed = harness.interleaved(jobs, args.repeat)
    source = str(Path(analysis.__file__).resolve().parents[1])
    title = f"job ({source}, {args.repeat} runs)"
    ratios: dict[str, float] = {}
    for clock in harness.CLOCKS:
        print(harness.table(f"{title}, {clock} time", timed, clock), end="\n\n")
        if "engine" in args.jobs:
            for name, num, den in (("P1", "ours2", "bare2"), ("six", "ours6", "bare6")):
                ratios[f"{name}_{clock}"] = timed[num].stat(clock) / timed[den].stat(clock)
    if ratios:
        print(", ".join(f"{name} {value:.3f}" for name, value in ratios.items()))
    harness.finish(args.json, {"tree": source, "n": args.n, "ratios": ratios}, timed)


if __name__ == "__main__":
    main()
