"""Cost of a cell's company (issue 24) against the plain atlas, and the cells the top-PC flag marks.

The demo atlas: the zoo (``models.training.ZOO``; those of its checkpoints found in ``--zoo``,
all of them trained there first with ``--train``) over the digits test split (450 images) at
the demo's batch size, 150, linear unbiased minibatch CKA on the CPU. Timed, best of
``--repeats`` rounds (:mod:`harness`), each running every kind once: the plain atlas; with
image-level intervals (``interval="images"``); with the whole-sample sensitivity
(``sensitivity=True``); with both; and, of the runs with both, the whole-sample step alone
(every layer's top direction, then what it carries in each batch:
:func:`analysis.estimators.spectrum.whole_sample_sensitivity`), which wall times on a noisy
machine blur. Then, on the atlas with sensitivity, how many cells the ``top_pc`` flag marks (a
single direction carries more than half of the cell's CKA, :mod:`analysis.batch_statistics.flags`)
against the former rule (CKA moves by more than 0.1 when one side's top component is removed).

With ``--timm N`` the workload is instead one where the forward passes dominate, as they do
for real models: the shard benchmark's two random-init 224-pixel timm models
(``mixer_s16_224``, ``resmlp_12_224``, 10 classes; their default 26 layers of 75-100 thousand
features) over N random images, batches of 32.

    .venv/bin/python bench/bench_company.py --zoo var/zoo --train
    .venv/bin/python bench/bench_company.py --timm 128 --repeats 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import harness  # bench/harness.py, beside this script
import numpy as np
import torch
from torch import nn
from workloads import TIMM_PAIR, time_whole_sample_step, timm_model

import analysis
import models
from analysis.data.datasets import load_digits
from models.checkpoint import weights_path
from models.training import ZOO, build_zoo

BATCH = 150
TIMM_BATCH = 32


def zoo_workload(zoo: Path, train: bool) -> tuple[dict[str, nn.Module], np.ndarray, int]:
    """The demo atlas: the zoo's trained digits models over the test split."""
    if train:
        build_zoo(analysis.training_data("digits"), zoo)
    found = [(name, weights_path(zoo / name)) for name, _, _ in ZOO]
    nets = {name: models.load(path)[0].eval() for name, path in found if path.exists()}
    return nets, load_digits("test").x, BATCH


def timm_workload(n: int) -> tuple[dict[str, nn.Module], torch.Tensor, int]:
    """The timm pair, random-init, over ``n`` uniform random 224-pixel images."""
    nets = {name: timm_model(name) for name in TIMM_PAIR}
    images = torch.rand(n, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return nets, images, TIMM_BATCH


whole_sample = time_whole_sample_step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("var/zoo"))
    parser.add_argument("--train", action="store_true", help="train missing zoo models first")
    parser.add_argument("--timm", type=int, metavar="N", help="the timm pair over N images")
    harness.options(parser, repeat=3, clock=None)
    args = harness.parse(parser)
    if args.timm:
        nets, data, batch = timm_workload(args.timm)
    else:
        nets, data, batch = zoo_workload(args.zoo, args.train)
    base = {"batch_size": batch, "device": "cpu"}
    runs = {
        "plain atlas": {},
        "image-level intervals": {"interval": "images"},
        "whole-sample sensitivity": {"sensitivity": True},
        "both": {"interval": "images", "sensitivity": True},
    }
    steps: dict[str, list[float]] = {name: [] for name in runs}

    def run(name: str) -> analysis.Atlas:
        whole_sample.clear()
        atlas = analysis.compare(nets, data, **base, **runs[name])
        steps[name].append(sum(whole_sample))
        return atlas

    print(f"{', '.join(nets)} over {len(data)} images, batches of {batch}")
    analysis.compare(nets, data, **base)  # untimed: first-call initialisation of torch and MKL
    jobs = {name: (lambda name=name: run(name)) for name in runs}
    timed = harness.interleaved(jobs, args.repeat, warm_up=False)
    print()
    print(harness.table("run (wall time)", timed, "wall", base="plain atlas", stat="min"))
    print(f"\nthe whole-sample step alone (best): {min(steps['both']):.2f} s")
    atlas = timed["both"].result
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
    print(f"\ntop_pc flag on this atlas: {flagged} of {cells} cells (former rule: {former})")
    figures = {"whole_sample_step_s": min(steps["both"]), "top_pc": [flagged, cells, former]}
    harness.finish(args.json, figures, timed)


if __name__ == "__main__":
    main()
