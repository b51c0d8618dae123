"""An instant command line (issue 47): `cka-atlas --help` and every subcommand's `--help` load no
heavy library, every subcommand takes `--no-progress`, and what the parsers quote of the
libraries (app/cli/help_data.json) is what the libraries say. Timings: bench/bench_cli_help.py
and BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.cli import build_parser, help_data

ROOT = Path(__file__).resolve().parents[2]
# Libraries that take seconds to import, and the parts of analysis beyond its light modules.
HEAVY = ("torch", "timm", "torchvision", "matplotlib", "sklearn", "scipy", "pandas", "models")
HEAVY += ("sqlalchemy", "alembic", "fastapi", "celery")
LIGHT_ANALYSIS = {"analysis", "analysis.errors", "analysis._lazy"}

# One interpreter asks every command line for its help in turn and, after each, names the heavy
# modules loaded so far.
CHILD = """
import contextlib, io, json, sys
from app.cli import COMMANDS, main

heavy = {heavy!r}
lines = [[]] + [[c] for c in COMMANDS] + [[g, a] for g, a in {groups!r}]
seen = {{}}
for argv in lines:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*argv, "--help"])
        except SystemExit:
            pass
    assert out.getvalue().startswith("usage: cka-atlas"), (argv, out.getvalue()[:200])
    loaded = [m for m in sys.modules if m.split(".")[0] in heavy]
    loaded += [m for m in sys.modules if m.startswith("analysis.") and m not in {light!r}]
    seen[" ".join(argv)] = sorted(loaded)
    if "%%" in out.getvalue():  # an escape shown as it is (a description is not %-formatted)
        seen[" ".join(argv)].append("%%")
print(json.dumps(seen))
"""
GROUPS = [("study", a) for a in ("run", "plan", "list")]
GROUPS += [("db", a) for a in ("upgrade", "current")]
GROUPS += [("token", a) for a in ("create", "list", "revoke")]


def test_help_loads_no_heavy_library() -> None:
    """Also: no help shows a doubled %% (issue 47: `study plan --help` said "80 %% power")."""
    script = CHILD.format(heavy=HEAVY, groups=GROUPS, light=LIGHT_ANALYSIS)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert len(seen) > 20
    assert {line: mods for line, mods in seen.items() if mods} == {}


def test_every_command_accepts_no_progress() -> None:
    parser = build_parser()
    leaves = [("compare", "a.safetensors", "--dataset", "digits"), ("gc",), ("models",)]
    leaves += [("study", "list"), ("token", "list"), ("db", "current"), ("export", "1")]
    leaves += [("layers", "x"), ("import", "x"), ("serve",), ("demo",), ("zoo",)]
    leaves += [("train", "--arch", "mlp_digits"), ("study", "plan", "s.yaml", "--pilot", "p")]
    for argv in leaves:
        assert parser.parse_args([*argv, "--no-progress"]).no_progress is True, argv


def test_the_help_data_is_what_the_libraries_say() -> None:
    """help_data.json is derived: regenerate it with `python -m app.cli.help_data`."""
    assert help_data.load() == help_data.current(), (
        "app/cli/help_data.json is stale: run `python -m app.cli.help_data`"
    )
