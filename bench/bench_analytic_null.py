"""What the analytic null costs: the demo atlas with ``null="analytic"`` against ``null="none"``.

The same job as ``bench/bench_permutations.py``: the six zoo models of ``make run`` (five
``*_digits`` presets and a second seed of the Mixer), digits (the 450 test images), batches of
150 (the demo's), default layers, linear unbiased minibatch CKA, on the CPU. ``--zoo DIR``
loads the trained demo zoo from DIR (``make run`` trains it into ``zoo/``; the tail check's
draws depend on the layers, so this is the demo atlas itself); without it the models are
untrained. The runs alternate (none, analytic) ``--repeat`` times; medians are reported, and
their ratio. Issues 20 and 37 ask for at most 1.1. ``--permutations P`` adds P brute-force
permutations to the same table, for reference. The last line says what the analytic null's
p-values rest on (its tail check, :mod:`analysis.inference.analytic_null`).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_analytic_null.py --zoo zoo
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from workloads import demo_models  # bench/workloads.py, beside this script

import analysis


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--permutations", type=int, default=0)
    ap.add_argument("--zoo", help="the trained demo zoo's directory (default: untrained models)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or the process's CPU time (steadier on a machine others load)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nets = demo_models(args.zoo)
    data = analysis.load_dataset("digits")  # the test split, as the demo registers it

    atlases: dict[str, analysis.Atlas] = {}

    clock = time.perf_counter if args.clock == "wall" else time.process_time

    def run(**null: object) -> float:
        start = clock()
        atlas = analysis.compare(nets, data, batch_size=args.batch, device="cpu", **null)
        atlases[str(null)] = atlas
        return clock() - start

    kinds: dict[str, dict[str, object]] = {"none": {"null": "none"}, "analytic": {}}
    if args.permutations:
        kinds[f"{args.permutations} permutations"] = {"permutations": args.permutations}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kw in kinds.values():
        run(**kw)  # warm-up
    for _ in range(args.repeat):
        for kind, kw in kinds.items():
            times[kind].append(run(**kw))
    base = statistics.median(times["none"])
    what = f"6 {'trained' if args.zoo else 'untrained'} models, n={len(data)}, batch {args.batch}"
    print(f"| null ({what}, {args.clock} clock) | median | ratio to none |")
    print("|---|---:|---:|")
    for kind, values in times.items():
        t = statistics.median(values)
        print(f"| {kind} | {t:.3f} s | {t / base:.2f} |")
    tail = atlases[str({})].diagnostics.get("null")
    print(f"tail check: {tail if tail is not None else 'none (this code has no tail check)'}")


if __name__ == "__main__":
    main()
