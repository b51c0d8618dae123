"""What the measures beside CKA cost (issue 35): the demo atlas with each measure against CKA alone.

The job of ``bench/bench_analytic_null.py``: the six zoo models of ``make run`` (five
``*_digits`` presets and a second Mixer seed; ``--zoo DIR`` loads the trained ones, else they
are untrained: the cost depends on shapes, not weights), digits (the 450 test images), batches
of 150, default layers, linear unbiased minibatch CKA with the default analytic null, on the CPU.
The kinds — CKA alone, each measure beside it, all of them — run in interleaved rounds after a
warm-up of CKA alone (:mod:`harness`; ``--repeat`` of them, each run's seconds on stderr as it
ends), and each kind's median, range and ratio to CKA alone are printed. ``--clock cpu`` (the
default) times the process's CPU time, steadier than wall time on a machine others load. Then
the memory each layer needs: its kept features (n × d × 4 bytes), and what
:func:`analysis.measures.estimate_bytes` estimates for it alone with every measure (kept
features, float64 factors, working set).

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_measures.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics

import harness  # bench/harness.py, beside this script
import torch
from workloads import DemoAtlas

import analysis
from analysis.layers import LayerReader
from analysis.measures import WHOLE_SAMPLE, estimate_bytes

MIB = 2**20
KINDS = {"cka": ("cka",), **{m: ("cka", m) for m in WHOLE_SAMPLE}, "all": ("cka", *WHOLE_SAMPLE)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    DemoAtlas.options(ap)
    harness.options(ap, repeat=3, clock="cpu")
    args = harness.parse(ap)
    atlas = DemoAtlas.load(args.zoo, args.batch)
    atlas(measures=("cka",))  # warm-up
    jobs = {kind: (lambda m=measures: atlas(measures=m)) for kind, measures in KINDS.items()}
    timed = harness.interleaved(jobs, args.repeat, warm_up=False, verbose=True)
    title = f"measures ({atlas.describe()}, {args.clock} time, {args.repeat} runs)"
    print(harness.table(title, timed, args.clock, base="cka"), flush=True)

    nets, data, n = atlas.nets, atlas.data, len(atlas.data)
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
    harness.finish(args.json, {"job": atlas.describe(), "estimate_bytes": total}, timed)


if __name__ == "__main__":
    main()
