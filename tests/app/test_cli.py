"""The ``cka-atlas`` dispatcher: a command line builds only the parsers of its command's module."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

from app.cli import COMMAND_MODULES, COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_the_command_table_is_what_each_module_adds() -> None:
    for name in COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        importlib.import_module(f"app.cli.{name}").register(parser.add_subparsers())
        assert _choices(parser) == {c for c, m in COMMANDS.items() if m == name}, name
    assert _choices(build_parser()) == set(COMMANDS)
    assert _choices(build_parser(["db", "current"])) == {"serve", "worker", "demo", "db"}
    assert _choices(build_parser(["--help"])) == set(COMMANDS)  # no command: all of them


def test_a_store_command_imports_no_torch(tmp_path: Path) -> None:
    """``db upgrade`` and ``db current`` run without the libraries' parsers, hence without
    torch or timm (seconds of imports)."""
    script = (
        "import sys\nfrom app.cli import main\n"
        "main(['db', 'upgrade'])\nrc = main(['db', 'current'])\n"
        "print(rc, sorted(m for m in ('torch', 'timm', 'analysis', 'models') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("CKA_")},
            "PYTHONPATH": str(ROOT),
            "CKA_DATA_DIR": str(tmp_path / "var"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []"
