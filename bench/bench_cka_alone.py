"""CKA alone on the demo atlas, timed in this process: run it under two trees to compare them.

The job of ``bench/bench_measures.py``'s first row (six untrained demo models, digits, batches
of 150, default options) ``--repeat`` times after a warm-up; prints the median and the runs, in
CPU time. Issue 35 asks that CKA alone cost what it did before the measures: run it once per
tree, alternating, e.g. ::

    for i in 1 2 3; do
      PYTHONPATH=/path/to/main python bench/bench_cka_alone.py
      PYTHONPATH=$PWD python bench/bench_cka_alone.py
    done
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
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nets = demo_models()
    data = analysis.load_dataset("digits")
    analysis.compare(nets, data, batch_size=150, device="cpu")  # warm-up
    times = []
    for _ in range(args.repeat):
        start = time.process_time()
        analysis.compare(nets, data, batch_size=150, device="cpu")
        times.append(time.process_time() - start)
    runs = ", ".join(f"{t:.3f}" for t in times)
    print(f"{analysis.__file__}: median {statistics.median(times):.3f} s CPU ({runs})")


if __name__ == "__main__":
    main()
