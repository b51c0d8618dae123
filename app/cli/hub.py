"""``cka-atlas import``: a Hugging Face / timm model folder (or its .zip) as a checkpoint."""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

from app.cli.commands import command

__all__ = ["register", "run_import"]


def register(subparsers: Any) -> None:
    p = command(
        subparsers,
        "import",
        run_import,
        "convert a Hugging Face / timm model folder into a checkpoint",
        "Read config.json + model.safetensors (as timm's save_for_hf writes them) "
        "from a folder or a .zip, load the weights strictly into the named timm architecture, "
        "and write DIR/NAME.safetensors with a sidecar that keeps the folder's data config "
        "(the model's input pipeline). Pickle-based .bin/.pth files are refused.",
    )
    p.add_argument("path", type=Path, metavar="PATH", help="model folder or .zip of one")
    p.add_argument("--name", help="checkpoint name (default: the architecture)")
    p.add_argument("--out", type=Path, default=Path("var/checkpoints"), help="output directory")


def run_import(args: argparse.Namespace) -> int:
    from models.hub import import_hub, read_hub

    with tempfile.TemporaryDirectory(prefix="cka-import-") as tmp:
        name = args.name or read_hub(args.path, tmp).architecture
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "model"
        path = import_hub(args.path, args.out / f"{safe}.safetensors", tmp)
    import models

    meta = models.read_sidecar(path)
    pp = meta["preprocessing"]
    size = "×".join(str(v) for v in pp["input_size"])
    print(f"{path}  {meta['arch']}  input {size} {pp['interpolation']} crop {pp['crop_pct']}")
    return 0
