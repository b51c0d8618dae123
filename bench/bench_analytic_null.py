"""What a null costs: the demo atlas with the analytic null, and with permutations, against none.

The demo atlas of ``make run``: the six zoo models (five ``*_digits`` presets and a second seed
of the Mixer), digits (the 450 test images), batches of 150 (the demo's), default layers, linear
unbiased minibatch CKA, on the CPU. ``--zoo DIR`` loads the trained demo zoo from DIR (``make
run`` trains it into ``zoo/``; the tail check's draws depend on the layers, so this is the demo
atlas itself); without it the models are untrained, which costs the same otherwise. Interleaved
rounds (:mod:`harness`) of ``null="none"`` and the default ``null="analytic"`` (issues 20 and 37
ask for at most 1.1); ``--permutations P`` adds the permutation null of P shuffles (issue 13
asks for at most 2 at P = 200; it was ``bench/bench_permutations.py``). Medians, ranges and
their ratio to none are printed; the last line says what the analytic null's p-values rest on
(its tail check, :mod:`analysis.inference.analytic_null`).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_analytic_null.py --zoo zoo
    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_analytic_null.py --permutations 200
"""

from __future__ import annotations

import argparse

import harness  # bench/harness.py, beside this script
from workloads import DemoAtlas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    DemoAtlas.options(ap)
    ap.add_argument("--permutations", type=int, default=0)
    harness.options(ap, repeat=7, clock="wall")
    args = harness.parse(ap)
    atlas = DemoAtlas.load(args.zoo, args.batch)
    jobs = {"none": lambda: atlas(null="none"), "analytic": atlas}
    if args.permutations:
        jobs[f"{args.permutations} permutations"] = lambda: atlas(permutations=args.permutations)
    timed = harness.interleaved(jobs, args.repeat)
    title = f"null ({atlas.describe()}, {args.clock} clock)"
    print(harness.table(title, timed, args.clock, base="none"))
    tail = timed["analytic"].result.diagnostics.get("null")
    print(f"tail check: {tail if tail is not None else 'none (this code has no tail check)'}")
    harness.finish(args.json, {"job": atlas.describe(), "tail_check": tail}, timed)


if __name__ == "__main__":
    main()
