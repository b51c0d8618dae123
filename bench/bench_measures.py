"""What the measures beside CKA cost (issue 35): the demo atlas with each measure against CKA alone.

The job of ``bench/bench_analytic_null.py``: the six zoo models of ``make run`` (five
``*_digits`` presets and a second Mixer seed; ``--zoo DIR`` loads the trained ones, else they
are untrained: the cost depends on shapes, not weights), digits (the 450 test images), batches
of 150, default layers, linear unbiased minibatch CKA with the default analytic null, on the CPU.
Each kind runs ``--repeat`` times — CKA alone, then each measure beside it, then all of them —
and its median and ratio to CKA alone are printed as it ends. ``--clock cpu`` (the default)
times the process's CPU time, steadier than wall time on a machine others load. Then the memory
each layer needs: its kept features (n × d × 4 bytes), and what
:func:`analysis.measures.estimate_bytes` estimates for it alone with every measure (kept
features, float64 factors, working set).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_measures.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from workloads import demo_models  # bench/workloads.py, beside this script

import analysis
from analysis.layers import LayerReader
from analysis.measures import WHOLE_SAMPLE, estimate_bytes

MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--zoo", help="the trained demo zoo's directory (default: untrained models)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    nets = demo_models(args.zoo)
    data = analysis.load_dataset("digits")  # the test split, as the demo registers it
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def run(measures: tuple[str, ...]) -> float:
        start = clock()
        analysis.compare(nets, data, batch_size=args.batch, device="cpu", measures=measures)
        return clock() - start

    kinds = {
        "cka": ("cka",),
        **{m: ("cka", m) for m in WHOLE_SAMPLE},
        "all": ("cka", *WHOLE_SAMPLE),
    }
    run(("cka",))  # warm-up
    n = len(data)
    what = f"6 {'trained' if args.zoo else 'untrained'} models, n={n}, batch {args.batch}"
    print(
        f"| measures ({what}, {args.clock} time, median of {args.repeat}) | time "
        "| ratio to CKA alone |"
    )
    print("|---|---:|---:|", flush=True)
    base = 0.0
    for kind, measures in kinds.items():  # each kind's repeats together: rows print as they end
        t = statistics.median(run(measures) for _ in range(args.repeat))
        base = base or t
        print(f"| {kind} | {t:.2f} s | {t / base:.2f} |", flush=True)

    batch = torch.as_tensor(data.x[:2]).float()
    widths: list[int] = []
    with torch.inference_mode():
        for net in nets.values():
            layers = analysis.default_layers(net)
            widths += [int(f[0].numel()) for f in LayerReader(net, layers)(batch)]
    every = ("cka", *WHOLE_SAMPLE)
    sizes = {
        "kept features (fp32)": [n * d * 4 for d in widths],
        "the layer alone, every measure (estimate)": [
            estimate_bytes(n, [d], every) for d in widths
        ],
    }
    print()
    print(f"{len(widths)} layers, widths {min(widths)}–{max(widths)} features (n = {n}):")
    print("| memory per layer | min | median | max |")
    print("|---|---:|---:|---:|")
    for name, per_layer in sizes.items():
        mib = [s / MIB for s in per_layer]
        print(
            f"| {name} | {min(mib):.2f} MiB | {statistics.median(mib):.2f} MiB "
            f"| {max(mib):.2f} MiB |"
        )
    total = estimate_bytes(n, widths, every)
    print(f"whole atlas, every measure: estimate {total / MIB:.1f} MiB")


if __name__ == "__main__":
    main()
