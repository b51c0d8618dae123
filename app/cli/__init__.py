"""The ``cka-atlas`` command line: a thin dispatcher over one module per subcommand group.

Owns argument parsing, progress bars and turning errors into one sentence on stderr. The top
of the stack: it may import every layer of :mod:`app` (http, jobs, store) and the libraries.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from app.cli.commands import CommandError, Parser
from app.errors import library_error

__all__ = ["SERVICE_MODULES", "main"]

# Each of these modules in app.cli exposes ``register(subparsers)``, which adds its parsers and sets
# ``func`` on them; importing lazily keeps ``cka-atlas --help`` fast.
COMMAND_MODULES = (
    "train",
    "compare",
    "models",
    "export",
    "hub",
    "study",
    "service",
    "tokens",
    "gc",
)
# The commands each module adds. A command line that names one builds that module's parsers
# alone: the parsers of `train` and `compare` list the presets and the comparison options, which
# imports torch and timm (seconds), and `cka-atlas db current` or `token list` need neither.
COMMANDS = {
    "train": "train",
    "zoo": "train",
    "compare": "compare",
    "models": "models",
    "layers": "models",
    "export": "export",
    "import": "hub",
    "study": "study",
    "serve": "service",
    "worker": "service",
    "demo": "service",
    "db": "service",
    "token": "tokens",
    "gc": "gc",
}

# What the `service` extra of pyproject.toml installs, by import name: a command that needs one
# of them where only the libraries are installed says which extra to install (no traceback).
SERVICE_MODULES = frozenset(
    {
        "alembic",
        "cachetools",
        "celery",
        "fastapi",
        "fastapi_offline",
        "jinja2",
        "kombu",
        "limits",
        "multipart",
        "prometheus_client",
        "psycopg",
        "pyarrow",
        "pydantic_settings",
        "python_multipart",
        "redis",
        "sqlalchemy",
        "starlette",
        "uvicorn",
    }
)


def _one_sentence(exc: BaseException) -> bool:
    """Whether ``exc`` is told as one sentence: a command's own refusal
    (:class:`app.cli.commands.CommandError`), a missing file, or a user-facing error of the
    libraries (``ModelError``, ``AnalysisError``: :func:`app.errors.library_error`, which
    looks them up among the loaded modules, so a command that needs neither library — ``db``,
    ``token``, ``study list``, ``--help`` — does not import torch for the check).
    """
    if isinstance(exc, CommandError | FileNotFoundError):
        return True
    return library_error(exc) is not None


def _needs_service(exc: ModuleNotFoundError) -> bool:
    return (exc.name or "").split(".")[0] in SERVICE_MODULES


def _unavailable(exc: ModuleNotFoundError) -> Callable[[argparse.Namespace], int]:
    def run(_: argparse.Namespace) -> int:
        raise exc

    return run


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``cka-atlas`` parser: every command's, or where ``argv`` starts with a command (as
    ``main`` passes it) only the parsers of the module that adds it (:data:`COMMANDS`)."""
    parser = Parser(
        prog="cka-atlas",
        description="Layer-by-layer CKA between neural networks: train, compare, serve.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = COMMANDS.get(argv[0]) if argv else None
    for name in COMMAND_MODULES if named is None else (named,):
        try:
            module = importlib.import_module(f"app.cli.{name}")
            module.register(subparsers)
        except ModuleNotFoundError as exc:
            if exc.name == f"app.cli.{name}":
                continue
            if not _needs_service(exc):
                raise
            # A module whose parser needs the service stack: its command (named after it)
            # still exists, and says which extra it needs.
            # (no option prefix, so that every argument it is given lands in ``rest``).
            stub = subparsers.add_parser(
                name, help="(needs the service extra)", prefix_chars="\0", add_help=False
            )
            stub.add_argument("rest", nargs="*")
            stub.set_defaults(func=_unavailable(exc))
    _accept_no_progress(parser)
    return parser


def _every_command(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of every (sub)command under ``parser``, groups' actions included."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _every_command(sub) or [sub]
    return found


def _accept_no_progress(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` on every command, so that a script can pass it to any: the commands
    that draw no progress bar take it and change nothing."""
    for sub in _every_command(parser):
        flags = {flag for action in sub._actions for flag in action.option_strings}
        if "--no-progress" not in flags and sub.add_help:
            sub.add_argument(
                "--no-progress", action="store_true", help="(no progress bar here to hide)"
            )


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        if not _needs_service(exc):
            raise
        print(
            f"error: `cka-atlas {args.command}` needs the service extra, which is not "
            f'installed (no module {exc.name!r}); install it with pip install "cka-atlas[service]"',
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        if not _one_sentence(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
