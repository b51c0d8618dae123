"""Coverage of the image-level intervals (issue 24), at batch sizes 50 and 150, printed as markdown.

A fixed pair of trained digits networks (the zoo presets ``mixer_digits`` and
``rp_mixer_digits``, trained into ``--zoo`` if missing) and a pool, the 1797 digits images.
Each draw takes 450 images from the pool with replacement (independent draws from the pool's
distribution), runs ``analysis.compare(..., interval="images")`` (the image-level interval) at the
batch size, and checks, for every cell between the two networks, whether the 95 % interval
holds the CKA of that distribution: the pool's CKA in full mode with the biased estimator (the
population value of the unbiased minibatch estimate the draws make). Target: 93-97 % at both
batch sizes; the interval widths at the two batch sizes should match too.

    .venv/bin/python bench/bench_intervals.py               # 200 draws (a few minutes)
    .venv/bin/python bench/bench_intervals.py --draws 40    # a quicker, noisier run
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import analysis
import models
from analysis.data.datasets import load_digits
from models.checkpoint import weights_path

PAIR = ("mixer_digits", "rp_mixer_digits")
SUBSET = 450


def trained_pair(zoo: Path) -> dict[str, torch.nn.Module]:
    """The two zoo networks, trained into ``zoo`` first where their checkpoints are missing."""
    nets = {}
    for arch in PAIR:
        path = weights_path(zoo / arch)
        if not path.exists():
            path = models.train(arch, "digits", seed=0, out_dir=zoo, name=arch)
        nets[arch] = models.load(path)[0].eval()
    return nets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("var/zoo"))
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    nets = trained_pair(args.zoo)
    pool = load_digits("all").x
    a, b = PAIR
    truth = analysis.compare(
        nets, pool, mode="full", estimator="biased", batch_size=512, device="cpu"
    ).matrix(a, b)
    print(f"pair {a} × {b}, pool {len(pool)} digits images, {args.draws} draws of {SUBSET}")
    print("\n| batch size | batches | coverage | worst cell | median width | median sd / spread |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(args.seed)
    draws = [rng.integers(0, len(pool), SUBSET) for _ in range(args.draws)]
    for batch in (50, 150):
        hits, widths, estimates = [], [], []
        for idx in draws:
            atlas = analysis.compare(
                nets, pool[idx], batch_size=batch, interval="images", device="cpu"
            )
            low, high = atlas.interval(a, b)  # type: ignore[misc]
            hits.append((low <= truth) & (truth <= high))
            widths.append(high - low)
            estimates.append(atlas.matrix(a, b))
        cover = np.array(hits, dtype=float)
        width = np.array(widths)
        spread = np.std(np.array(estimates), axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            sd_ratio = np.nanmedian(np.nanmean(width, 0) / (2 * 1.959964) / spread)
        print(
            f"| {batch} | {SUBSET // batch} | {cover.mean():.1%} | {cover.mean(0).min():.0%} "
            f"| {np.median(width):.4f} | {sd_ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
