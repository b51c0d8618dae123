"""What a permutation null costs: the demo atlas with 200 permutations against without.

The demo atlas of ``make run``: the six zoo models (five ``*_digits`` presets and a second seed
of the Mixer; untrained here, which costs the same as trained), digits (the 450 test images),
batches of 150 (the demo's), default layers, linear unbiased minibatch CKA, on the CPU. The
runs alternate (without, with) ``--repeat`` times; medians are reported, and their ratio.
Issue 13 asks for at most 2.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_permutations.py
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
    ap.add_argument("--permutations", type=int, default=200)
    ap.add_argument("--batch", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nets = demo_models()
    data = analysis.load_dataset("digits")  # the test split, as the demo registers it

    def run(permutations: int) -> float:
        start = time.perf_counter()
        analysis.compare(nets, data, batch_size=args.batch, device="cpu", permutations=permutations)
        return time.perf_counter() - start

    run(0), run(args.permutations)  # warm-up
    plain, permuted = [], []
    for _ in range(args.repeat):
        plain.append(run(0))
        permuted.append(run(args.permutations))
    t0, t1 = statistics.median(plain), statistics.median(permuted)
    print(f"| atlas (6 models, n={len(data)}, batch {args.batch}) | {t0:.3f} s |")
    print(f"| same atlas, {args.permutations} permutations | {t1:.3f} s |")
    print(f"| ratio | {t1 / t0:.2f} |")


if __name__ == "__main__":
    main()
