"""How long `cka-atlas --help` and each subcommand's `--help` take, and which heavy modules
they load (issue 47: the CLI took 10–12 s to start, even for `--help`).

Each command line runs ``--repeat`` times in a fresh interpreter, in turns (every command once,
then again: :func:`harness.interleaved`, with no warm-up, as a user's first call has none), as
the installed `cka-atlas` script does (``from app.cli import main; main()``); the wall time of
each run is measured around the child process, and the median is reported with the fastest and
slowest run. The last column names the heavy modules the command loaded. A machine others load
makes every figure longer: the script prints the machine line (:func:`harness.machine_line`,
with the load average) before and after, so that a run can be judged (the issue's figures are
for an idle machine); ``--json PATH`` keeps every run.

    .venv/bin/python bench/bench_cli_help.py          # the code of this checkout

``--source DIR`` (repeatable) runs the code of DIR instead, e.g. a copy of an older commit
(``mkdir /tmp/before && git archive 1ffe996 | tar -x -C /tmp/before``); several sources run in
turns too, so that a before/after table shares one machine's load:

    .venv/bin/python bench/bench_cli_help.py --source /tmp/before --source .
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import harness  # bench/harness.py, beside this script

HEAVY = ("torch", "timm", "torchvision", "matplotlib", "sklearn", "scipy", "models", "sqlalchemy")
COMMANDS: tuple[list[str], ...] = (
    [],
    ["train"],
    ["zoo"],
    ["compare"],
    ["models"],
    ["layers"],
    ["export"],
    ["import"],
    ["study", "run"],
    ["study", "plan"],
    ["study", "list"],
    ["serve"],
    ["worker"],
    ["demo"],
    ["db", "current"],
    ["token", "list"],
    ["gc"],
)
# Runs the command as the installed script does, then names the heavy modules it loaded.
CHILD = """
import sys
from app.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def run(source: Path, argv: list[str]) -> str:
    """One fresh `cka-atlas ARGV --help`: the heavy modules it loaded."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(heavy=HEAVY), *argv, "--help"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or "usage: cka-atlas" not in done.stdout:
        raise SystemExit(f"`cka-atlas {' '.join(argv)} --help` failed: {done.stderr[-2000:]}")
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, action="append", help="default: this checkout")
    ap.add_argument("--only", nargs="*", help="only these commands (e.g. compare 'study plan')")
    harness.options(ap, repeat=5, clock=None, threads=None)
    args = harness.parse(ap)
    sources = [p.resolve() for p in args.source or [Path(__file__).resolve().parents[1]]]
    commands = [c for c in COMMANDS if not args.only or " ".join(c) in args.only]
    jobs = {
        f"`cka-atlas {' '.join([*argv, '--help'])}` ({source})": partial(run, source, argv)
        for argv in commands
        for source in sources
    }
    print(f"before: {harness.machine_line()}; {args.repeat} runs each, in turns")
    timed = harness.interleaved(jobs, args.repeat, warm_up=False)
    loaded = {name: times.result or "—" for name, times in timed.items()}
    print(
        harness.table(
            "command (code)", timed, "wall", digits=2, notes=("heavy modules loaded", loaded)
        )
    )
    harness.finish(args.json, {"loaded": loaded}, timed)


if __name__ == "__main__":
    main()
