"""``cka-atlas train`` and ``cka-atlas zoo``: train one checkpoint, or the demo zoo."""

from __future__ import annotations

import argparse
import json
from typing import Any

from app.cli import help_data
from app.cli.commands import command, no_progress_flag

__all__ = ["device_flags", "parse_sets", "register", "run_train", "run_zoo"]


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as options; VALUE is read as JSON (``0.125``, ``true``, ``[1, 2]``),
    and anything that is not JSON is kept as a string."""
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def device_flags(parser: argparse.ArgumentParser, *, precision: bool = True) -> None:
    """``--device`` (and ``--precision``): where and how a training runs (models.devices)."""
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:K (default: cpu; the service's workers train on their "
        "CKA_DEVICE). The checkpoint records it",
    )
    if precision:
        parser.add_argument(
            "--precision",
            choices=help_data.load()["precisions"],
            default="fp32",
            help="fp32, or bf16 autocast of the forward pass (default: fp32)",
        )


def register(subparsers: Any) -> None:
    """Add the ``train`` and ``zoo`` subcommands to the ``cka-atlas`` parser."""
    presets = ", ".join(help_data.load()["presets"])
    train = command(
        subparsers,
        "train",
        run_train,
        "train one architecture and write a checkpoint",
        "Train a preset (or any timm model) with AdamW and a cosine schedule; "
        "write DIR/NAME.safetensors and its JSON sidecar with the test accuracy.",
    )
    train.add_argument("--arch", required=True, help=f"preset ({presets}) or a timm model name")
    train.add_argument(
        "--dataset", default="digits", help="'digits' or a .npz/ImageFolder/.zip path"
    )
    train.add_argument("--epochs", type=int, default=None, help="default: the family's recipe")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", default="var/checkpoints", help="output directory")
    train.add_argument("--name", default=None, help="checkpoint name (default: the arch)")
    train.add_argument("--batch-size", type=int, default=None)
    train.add_argument("--lr", type=float, default=None)
    train.add_argument(
        "--set",
        dest="options",
        action="append",
        metavar="KEY=VALUE",
        help="an architecture option, repeatable; VALUE is JSON, e.g. --set density=0.125 "
        "--set depth=6 (unknown keys and out-of-range values are refused before training)",
    )
    device_flags(train)
    no_progress_flag(train, "bar")

    zoo = command(
        subparsers,
        "zoo",
        run_zoo,
        "train the demo zoo (five digits presets and a second Mixer seed)",
        "Train the demo zoo, skipping checkpoints that already exist, and print "
        "its table (model, parameters, Ω, test accuracy, seconds).",
    )
    zoo.add_argument("--out", default="var/zoo", help="output directory")
    device_flags(zoo, precision=False)
    no_progress_flag(zoo)


def run_train(args: argparse.Namespace) -> int:
    from analysis import training_data
    from models import read_sidecar, validate_config
    from models.devices import placement
    from models.training import train

    try:
        options = parse_sets(args.options)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"error: {exc}") from None
    validate_config(args.arch, options)  # a ConfigError names the key, before any work
    placement(args.device, args.precision)  # and a device that is not there
    path = train(
        args.arch,
        training_data(args.dataset),
        epochs=args.epochs,
        seed=args.seed,
        out_dir=args.out,
        batch_size=args.batch_size,
        lr=args.lr,
        device=args.device,
        precision=args.precision,
        progress=not args.no_progress,
        name=args.name,
        **options,
    )
    meta = read_sidecar(path)
    test, where = meta["metrics"]["test"], meta["training"]
    print(
        f"{path}: test accuracy {test['accuracy']:.2%} on {test['n']} images "
        f"(trained on {where['device']}, {where['device_name']}, {where['precision']})"
    )
    return 0


def run_zoo(args: argparse.Namespace) -> int:
    from analysis import training_data
    from models.training import build_zoo, format_zoo_table

    rows = build_zoo(
        training_data("digits"), args.out, progress=not args.no_progress, device=args.device
    )
    print(format_zoo_table(rows))
    return 0
