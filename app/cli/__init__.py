"""The ``cka-atlas`` command line: a thin dispatcher over one module per subcommand group.

Owns argument parsing, progress bars and turning errors into one sentence on stderr. The top
of the stack: it may import every layer of :mod:`app` (http, jobs, store) and the libraries.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from analysis import AnalysisError
from models import ModelError

__all__ = ["main"]

# Each of these modules in app.cli exposes ``register(subparsers)``, which adds its parsers and sets
# ``func`` on them; importing lazily keeps ``cka-atlas --help`` fast.
COMMAND_MODULES = ("train", "compare", "export", "hub", "study", "service", "tokens", "gc")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cka-atlas",
        description="Layer-by-layer CKA between neural networks: train, compare, serve.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"app.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ModelError, AnalysisError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
