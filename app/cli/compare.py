"""``cka-atlas compare``: CKA between every layer pair of checkpoints, from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare",
        help="CKA between every layer pair of the given checkpoints",
        description=(
            "Run every checkpoint once per batch over a dataset and write the CKA atlas: every "
            "layer pair of every model pair, each model with itself included."
        ),
    )
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help=".safetensors checkpoints")
    p.add_argument("--dataset", required=True, help="'digits' or a .npz / ImageFolder / .zip")
    p.add_argument("--split", default="test", help="split of the built-in digits (default test)")
    p.add_argument(
        "--layers",
        nargs="+",
        help="layer names, globs (blocks.*) or indices into the default list (default: all)",
    )
    p.add_argument("--kernel", default="linear", help="linear, rbf or rbf:T (default linear)")
    p.add_argument("--estimator", default="unbiased", choices=["unbiased", "biased"])
    p.add_argument("--mode", default="minibatch", choices=["minibatch", "full"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--feature", default="flatten", choices=["flatten", "mean_tokens", "cls"])
    p.add_argument("--bootstrap", type=int, default=0, metavar="B", help="bootstrap replicates")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="autocast the forward pass")
    p.add_argument("--gram-cache", type=Path, metavar="DIR", help="keep per-batch Grams here")
    p.add_argument("--out", type=Path, help="write the atlas as JSON here")
    p.add_argument("--heatmap", type=Path, help="write the heatmap grid here (.png or .svg)")
    p.set_defaults(func=run)


def _names(paths: list[Path]) -> list[str]:
    names: list[str] = []
    for p in paths:
        name, i = p.stem, 2
        while name in names:
            name, i = f"{p.stem}-{i}", i + 1
        names.append(name)
    return names


def _mean_diagonal(m: np.ndarray) -> str:
    d = np.diagonal(m)
    d = d[np.isfinite(d)]
    return f"{d.mean():.4f}" if d.size else "undefined"


def run(args: argparse.Namespace) -> int:
    import analysis
    import models  # heavy imports stay out of `cka-atlas --help`
    from analysis.plot import render_atlas

    dataset = analysis.load_dataset(args.dataset, split=args.split)
    paths = [Path(c) for c in args.checkpoints]
    loaded = {}
    keys = {}
    for name, path in zip(_names(paths), paths, strict=True):
        model, meta = models.load(path)
        loaded[name] = model
        keys[name] = str(meta.get("weights_sha256") or models.file_sha256(path))
    cache = analysis.DirectoryGramCache(args.gram_cache) if args.gram_cache else None
    atlas = analysis.compare(
        loaded,
        dataset,
        layers=args.layers,
        kernel=args.kernel,
        estimator=args.estimator,
        mode=args.mode,
        batch_size=args.batch_size,
        feature=args.feature,
        device=args.device,
        dtype=args.dtype,
        bootstrap=args.bootstrap,
        seed=args.seed,
        progress=True,
        gram_cache=cache,
        model_keys=keys,
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(atlas.to_dict(), allow_nan=False) + "\n")
    if args.heatmap:
        fmt = "svg" if args.heatmap.suffix.lower() == ".svg" else "png"
        args.heatmap.parent.mkdir(parents=True, exist_ok=True)
        args.heatmap.write_bytes(render_atlas(atlas, fmt))
    width = max(len(n) for n in atlas.models)
    print(f"n = {atlas.n} samples of {dataset.name}, {atlas.diagnostics['batches']} batches")
    print(f"{'a':<{width}}  {'b':<{width}}  mean diagonal CKA")
    for a, b in atlas.pairs():
        print(f"{a:<{width}}  {b:<{width}}  {_mean_diagonal(atlas.matrix(a, b))}")
    for item in atlas.diagnostics["undefined_layers"]:
        print(f"note: {item['model']} {item['layer']}: {item['reason']}")
    return 0
