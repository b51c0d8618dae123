"""Cost of a cell's company (issue 24) against the plain atlas, and the cells the top-PC flag marks.

The demo atlas: the zoo (``models.training.ZOO``; those of its checkpoints found in ``--zoo``,
all of them trained there first with ``--train``) over the digits test split (450 images) at
the demo's batch size, 150, linear unbiased minibatch CKA on the CPU. Timed, best of
``--repeats``: the plain atlas; with image-level intervals (``bootstrap=1``); with the
whole-sample sensitivity (``sensitivity=True``); with both. Then, on the atlas with
sensitivity, how many cells the ``top_pc`` flag marks (a single direction carries more than
half of the cell's CKA, :mod:`analysis.flags`) against the former rule (CKA moves by more than
0.1 when one side's top component is removed).

    .venv/bin/python bench/bench_company.py --zoo var/zoo --train
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import analysis
import models
from analysis.datasets import load_digits
from models.checkpoint import weights_path
from models.training import ZOO, build_zoo

BATCH = 150


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("var/zoo"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train", action="store_true", help="train missing zoo models first")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.train:
        build_zoo(analysis.training_data("digits"), args.zoo)
    found = [(name, weights_path(args.zoo / name)) for name, _, _ in ZOO]
    nets = {name: models.load(path)[0].eval() for name, path in found if path.exists()}
    data = load_digits("test").x
    base = {"batch_size": BATCH, "device": "cpu"}
    runs = {
        "plain atlas": {},
        "image-level intervals": {"bootstrap": 1},
        "whole-sample sensitivity": {"sensitivity": True},
        "both": {"bootstrap": 1, "sensitivity": True},
    }
    print(f"{len(nets)} zoo models over {len(data)} digits images, batches of {BATCH}")
    print("\n| run | seconds | × plain |\n|---|---|---|")
    plain = 0.0
    atlas = None
    for name, extra in runs.items():
        seconds, out = timed(
            lambda e=extra: analysis.compare(nets, data, **base, **e), args.repeats
        )
        plain = plain or seconds
        atlas = out if extra.get("sensitivity") else atlas
        print(f"| {name} | {seconds:.2f} | {seconds / plain:.2f} |")
    assert atlas is not None
    cells = flagged = former = 0
    for a, b in atlas.pairs():
        cka = atlas.matrix(a, b)
        drop = atlas.without_top_pc(a, b)
        assert drop is not None
        keep = np.triu(np.ones_like(cka, dtype=bool), 1) if a == b else np.ones_like(cka, bool)
        cells += int(keep.sum())
        shift = np.fmax(np.abs(drop[0] - cka), np.abs(drop[1] - cka))
        former += int((np.nan_to_num(shift) > 0.1)[keep].sum())
    flagged = sum(1 for f in atlas.flags if f["kind"] == "top_pc")
    print(f"\ntop_pc flag on the demo atlas: {flagged} of {cells} cells (former rule: {former})")


if __name__ == "__main__":
    main()
