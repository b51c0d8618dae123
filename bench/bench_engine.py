"""Benchmark of the CKA engine (issue 3): ratios measured within one run, printed as markdown.

The job: an 8-block MLP-Mixer and an 8-block gMLP from timm (32×32×3, patch 4, embed 128, gMLP
mlp_ratio 6, seeded random weights), 2048 random images, batch 256, every block output,
linear unbiased minibatch CKA, 2 CPU threads. Compared against the bare forward passes over
the same batches and against pytorch-cka (``pip install pytorch-cka==1.1.3``, the ``bench``
extra) on the same batches; then a 6-model atlas (3 Mixers, 3 gMLPs, seeds 0-2) against
pytorch-cka over the 15 pairs and against 6 bare forward passes; then peak RSS of the 2-model
job at n = 16384 against n = 2048, each in a fresh subprocess with images made batch by batch.

    .venv/bin/python bench/bench_engine.py            # the full benchmark (about 10 minutes)
    .venv/bin/python bench/bench_engine.py --quick    # a smoke run: n=512, fewer repeats
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import resource
import subprocess
import sys
from collections.abc import Iterator

import harness  # bench/harness.py, beside this script
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import analysis
from models import create

BATCH = 256
LAYERS = [f"blocks.{i}" for i in range(8)]


def mixer(seed: int) -> nn.Module:
    """timm's MlpMixer at its default ratios (token hidden C/2, so γt = 1 at S = 64; γc = 4)."""
    return create("mixer_cifar", embed_dim=128, token_expansion=1.0, seed=seed).eval()


def gmlp(seed: int) -> nn.Module:
    """timm's gMLP (MlpMixer with spatial gating blocks), γ = 6."""
    return create("gmlp_cifar", embed_dim=128, seed=seed).eval()


def images(n: int) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1234))


class LazyImages:
    """Random images made one batch at a time, so the input itself does not grow with n."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return -(-self.n // BATCH)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for i in range(len(self)):
            g = torch.Generator().manual_seed(i)
            yield torch.randn(min(BATCH, self.n - i * BATCH), 3, 32, 32, generator=g)


def bare(models: list[nn.Module], x: torch.Tensor) -> None:
    with torch.inference_mode():
        for i in range(0, len(x), BATCH):
            for m in models:
                m(x[i : i + BATCH])


def ours(models: dict[str, nn.Module], x: torch.Tensor) -> analysis.Atlas:
    return analysis.compare(models, x, layers=LAYERS, batch_size=BATCH, device="cpu")


def theirs(pairs: list[tuple[nn.Module, nn.Module]], x: torch.Tensor) -> list[np.ndarray]:
    from cka import CKA  # pytorch-cka

    loader = DataLoader(TensorDataset(x), batch_size=BATCH)
    out = []
    for a, b in pairs:
        with CKA(a, b, layers=LAYERS, device="cpu") as c:
            out.append(c._compare(loader, progress=False).double().numpy())
    return out


def rss_child(n: int) -> None:
    torch.set_num_threads(2)
    analysis.compare(
        {"mixer": mixer(0), "gmlp": gmlp(0)}, LazyImages(n), layers=LAYERS, device="cpu"
    )
    print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def rss(n: int) -> int:
    cmd = [sys.executable, __file__, "--rss-child", str(n)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return int(json.loads(out.strip().splitlines()[-1])["maxrss_kib"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n=512 and one repeat: a smoke run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child)
        return
    torch.set_num_threads(args.threads)
    n, reps = (512, 1) if args.quick else (2048, 3)
    x = images(n)
    m0, g0 = mixer(0), gmlp(0)
    rows: list[tuple[str, str, str]] = []

    # Interleaved repeats (bare, ours, theirs, bare, ...), best of each: load that drifts
    # during the run hits every side alike.
    two = harness.interleaved(
        {
            "bare": lambda: bare([m0, g0], x),
            "ours": lambda: ours({"mixer": m0, "gmlp": g0}, x),
            "theirs": lambda: theirs([(m0, g0)], x),
        },
        reps,
        warm_up=False,
    )
    t_bare2, t_ours2, t_them2 = (two[k].stat("wall", "min") for k in ("bare", "ours", "theirs"))
    atlas, (ref,) = two["ours"].result, two["theirs"].result
    assert isinstance(atlas, analysis.Atlas)
    agree = float(np.abs(atlas.matrix("mixer", "gmlp") - ref).max())
    # which side is closer to the truth: the same job with float64 models and Grams
    m64, g64 = copy.deepcopy(m0).double(), copy.deepcopy(g0).double()
    truth = ours({"mixer": m64, "gmlp": g64}, x.double()).matrix("mixer", "gmlp")
    err_ours = float(np.abs(atlas.matrix("mixer", "gmlp") - truth).max())
    err_them = float(np.abs(ref - truth).max())
    rows += [
        (
            "2-model job / bare forwards",
            f"{t_ours2:.2f} s / {t_bare2:.2f} s",
            f"{t_ours2 / t_bare2:.3f} (≤ 1.25)",
        ),
        (
            "2-model job / pytorch-cka",
            f"{t_ours2:.2f} s / {t_them2:.2f} s",
            f"{t_ours2 / t_them2:.3f} (≤ 1.0)",
        ),
        ("max abs difference vs pytorch-cka", f"{agree:.1e}", "(≤ 1e-4)"),
        ("max abs error vs float64: ours / pytorch-cka", f"{err_ours:.1e} / {err_them:.1e}", ""),
    ]

    six = {f"mixer{s}": mixer(s) for s in range(3)} | {f"gmlp{s}": gmlp(s) for s in range(3)}
    pairs = list(itertools.combinations(six.values(), 2))
    six_runs = harness.interleaved(
        {
            "bare": lambda: bare(list(six.values()), x),
            "ours": lambda: ours(six, x),
            "theirs": lambda: theirs(pairs, x),
        },
        1,
        warm_up=False,
    )
    t_bare6, t_ours6, t_them6 = (six_runs[k].stat("wall") for k in ("bare", "ours", "theirs"))
    atlas6, refs = six_runs["ours"].result, six_runs["theirs"].result
    assert isinstance(atlas6, analysis.Atlas) and isinstance(refs, list)
    agree6 = max(
        float(np.abs(atlas6.matrix(a, b) - r).max())
        for (a, b), r in zip(itertools.combinations(six, 2), refs, strict=True)
    )
    rows += [
        (
            "6-model atlas: pytorch-cka 15 pairs / ours",
            f"{t_them6:.2f} s / {t_ours6:.2f} s",
            f"{t_them6 / t_ours6:.2f}× (≥ 4)",
        ),
        (
            "6-model atlas / 6 bare forwards",
            f"{t_ours6:.2f} s / {t_bare6:.2f} s",
            f"{t_ours6 / t_bare6:.3f} (≤ 1.3)",
        ),
        ("max abs difference vs pytorch-cka, 15 pairs", f"{agree6:.1e}", "(≤ 1e-4)"),
    ]
    small, big = (n, 4 * n) if args.quick else (2048, 16384)
    r_small, r_big = rss(small), rss(big)
    rows.append(
        (
            f"peak RSS n={big} / n={small}",
            f"{r_big / 1024:.0f} MiB / {r_small / 1024:.0f} MiB",
            f"{r_big / r_small:.3f} (≤ 1.2)",
        )
    )

    print(f"{harness.machine_line()}; n={n}")
    print(f"(2-model rows: best of {reps}; 6-model rows: one run each)\n")
    print("| measure | times | ratio (target) |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
