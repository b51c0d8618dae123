"""bench_engine.py's two engine ratios, in wall and CPU time, for one source tree: for before/after.

P1 is the 2-model job (an MLP-Mixer and a gMLP, every block) over the bare forward passes of the
same batches; the six-model atlas is over six bare forward passes (bench_engine.py's jobs, without
its pytorch-cka columns, so it runs without the ``bench`` extra). CPU time (``process_time``) is
steadier than wall time on a shared machine. Run it alternately on two trees (an export of the
old commit and the working tree) and compare the medians:

    git archive <old> | tar -x -C /tmp/old
    for k in 1 2 3; do for t in /tmp/old .; do
        PYTHONPATH=$t .venv/bin/python bench/bench_engine_ratios.py --tree $t; done; done
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--n", type=int, default=512, help="images (bench_engine --quick: 512)")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many, per job")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    tree = str(args.tree.resolve())
    sys.path[:0] = [tree, f"{tree}/bench"]  # that tree's analysis and bench_engine
    import torch
    from bench_engine import bare, gmlp, images, mixer, ours

    torch.set_num_threads(args.threads)
    x = images(args.n)
    two = {"mixer": mixer(0), "gmlp": gmlp(0)}
    six = {f"mixer{s}": mixer(s) for s in range(3)} | {f"gmlp{s}": gmlp(s) for s in range(3)}
    ours(two, x[:256])  # warm-up
    jobs: dict[str, Callable[[], object]] = {
        "bare2": lambda: bare(list(two.values()), x),
        "ours2": lambda: ours(two, x),
        "bare6": lambda: bare(list(six.values()), x),
        "ours6": lambda: ours(six, x),
    }
    best = {k: (float("inf"), float("inf")) for k in jobs}
    for _ in range(args.repeats):  # interleaved: load that drifts hits every job alike
        for k, fn in jobs.items():
            wall, cpu = timed(fn)
            best[k] = (min(best[k][0], wall), min(best[k][1], cpu))
    out: dict[str, object] = {"tree": tree, "n": args.n}
    out |= {k: [round(w, 3), round(c, 3)] for k, (w, c) in best.items()}
    for name, num, den in (("P1", "ours2", "bare2"), ("six", "ours6", "bare6")):
        out[f"{name}_wall"] = round(best[num][0] / best[den][0], 3)
        out[f"{name}_cpu"] = round(best[num][1] / best[den][1], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
