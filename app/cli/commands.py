"""What the subcommand modules share to add themselves to the ``cka-atlas`` parser: a command
with its help and what runs it, and the switch that hides progress bars. Standard library only:
the library-only commands (train, compare) use it without the service extra."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["CommandError", "command", "no_progress_flag"]


class CommandError(Exception):
    """What stops a command, told as one sentence on stderr (exit status 2), never a traceback."""


Run = Callable[[argparse.Namespace], int]


def command(
    subparsers: Any, name: str, run: Run | None, summary: str, about: str | None = None
) -> argparse.ArgumentParser:
    """Add ``name`` to ``subparsers``: ``summary`` in its parent's list of commands, ``about``
    atop its own ``--help``; ``run(args)`` runs it (None for a group of actions)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=summary, description=about)
    if run is not None:
        parser.set_defaults(func=run)
    return parser


def no_progress_flag(parser: argparse.ArgumentParser, bars: str = "bars") -> None:
    """``--no-progress``: hide the progress bar(s) ``bars`` names."""
    parser.add_argument("--no-progress", action="store_true", help=f"hide the progress {bars}")
