"""What the subcommand modules share to add themselves to the ``cka-atlas`` parser: the parser
(whose refusal of an unknown choice names the closest), a command with its help and what runs
it, and the switch that hides progress bars. The standard library only (and
:mod:`analysis.errors` for a refused choice): the library-only commands (train, compare) use it
without the service extra, and ``--help`` loads nothing heavy."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["CommandError", "Parser", "command", "no_progress_flag"]


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of a value that is not among an option's choices also
    names the closest one (as Python 3.14's ``suggest_on_error`` does)."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is not None and value not in choices:
            from analysis.errors import did_you_mean  # light, but only wanted here

            listed = ", ".join(map(repr, choices))
            hint = did_you_mean(value, [str(choice) for choice in choices])
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r} (choose from {listed}){hint}"
            )


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
