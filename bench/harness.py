"""What the timing benchmarks share: interleaved runs of named jobs and their median, min and max
in wall and CPU time, the markdown table of them, the machine line and the JSON out.

A benchmark names its jobs (callables) and :func:`interleaved` runs them round by round — each
job once per round, in the order given, after one untimed warm-up call each — so a slow spell
of a shared machine falls on every job alike rather than on whichever was being timed during
it. Both clocks are read around every run: wall time (``time.perf_counter``) and the process's
CPU time (``time.process_time``: steadier on a machine others load; with several threads it
also counts their spinning). :func:`options` adds the flags such a benchmark takes,
:func:`parse` reads them, :func:`table` prints the figures and :func:`finish` says where they
were measured (:func:`machine_line`) and keeps them with it (``--json PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Clock = Literal["wall", "cpu"]
CLOCKS: tuple[Clock, ...] = ("wall", "cpu")
Stat = Literal["median", "min", "max"]
STATS: dict[Stat, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "min": min,
    "max": max,
}


@dataclass
class Timed:
    """One job's timed runs: the wall and CPU seconds of each, and what the last one returned."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    result: Any = None

    def runs(self, clock: Clock) -> list[float]:
        return self.wall if clock == "wall" else self.cpu

    def stat(self, clock: Clock, stat: Stat = "median") -> float:
        return float(STATS[stat](self.runs(clock)))

    def figures(self) -> dict[str, dict[str, Any]]:
        """Per clock: median, min, max and every run, in seconds (the JSON out)."""
        return {
            clock: {
                **{stat: round(self.stat(clock, stat), 4) for stat in ("median", "min", "max")},
                "runs": [round(t, 4) for t in self.runs(clock)],
            }
            for clock in CLOCKS
        }


def interleaved(
    jobs: Mapping[str, Callable[[], Any]],
    repeat: int,
    *,
    warm_up: bool = True,
    sync: Callable[[], None] = lambda: None,
    verbose: bool = False,
) -> dict[str, Timed]:
    """Time every job ``repeat`` times, round by round, each after an untimed warm-up call
    (``warm_up``). ``sync`` runs before each clock is read (a GPU's synchronize, so its queued
    work counts); ``verbose`` prints each run's seconds to stderr as it ends (a long benchmark's
    progress)."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, not {repeat}")
    if warm_up:
        for job in jobs.values():
            job()
    timed = {name: Timed() for name in jobs}
    for round_ in range(1, repeat + 1):
        for name, job in jobs.items():
            sync()
            wall, cpu = time.perf_counter(), time.process_time()
            result = job()
            sync()
            times = timed[name]
            times.wall.append(time.perf_counter() - wall)
            times.cpu.append(time.process_time() - cpu)
            times.result = result
            if verbose:
                print(
                    f"round {round_} of {repeat}, {name}: {times.wall[-1]:.2f} s wall, "
                    f"{times.cpu[-1]:.2f} s CPU",
                    file=sys.stderr,
                    flush=True,
                )
    return timed


def table(
    title: str,
    timed: Mapping[str, Timed],
    clock: Clock,
    *,
    base: str | None = None,
    stat: Stat = "median",
    digits: int = 3,
    notes: tuple[str, Mapping[str, str]] | None = None,
) -> str:
    """A markdown table of the jobs: ``stat`` of their runs on ``clock``, their range, (with
    ``base``) the ratio of ``stat`` to job ``base``'s, and (with ``notes``, a column's head and
    each job's text) what else a benchmark says of each job. Seconds have ``digits`` decimals."""
    head = f"| {title} | {stat} | min–max |" + (f" ratio to {base} |" if base else "")
    rule = "|---|---:|---:|" + ("---:|" if base else "")
    if notes is not None:
        head, rule = f"{head} {notes[0]} |", f"{rule}---|"
    lines = [head, rule]
    for name, times in timed.items():
        middle, low, high = (f"{times.stat(clock, s):.{digits}f}" for s in (stat, "min", "max"))
        row = f"| {name} | {middle} s | {low}–{high} s |"
        if base:
            row += f" {times.stat(clock, stat) / timed[base].stat(clock, stat):.2f} |"
        if notes is not None:
            row += f" {notes[1].get(name, '—')} |"
        lines.append(row)
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Where figures are measured: the CPU, the system, Python, torch and its threads (when the
    benchmark loaded torch), and the load average now (a shared machine's others)."""
    torch = sys.modules.get("torch")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "load_average": [round(x, 2) for x in load],
    }


def machine_line(*extra: str) -> str:
    """:func:`machine` in one line, with ``extra`` (other versions that matter) after Python."""
    m = machine()
    versions = [f"Python {m['python']}"]
    if m["torch"] is not None:
        versions.append(f"torch {m['torch']} ({m['torch_threads']} threads)")
    load = " ".join(f"{x:.2f}" for x in m["load_average"])
    return (
        f"{m['system']}, {m['cpu']}, {m['cpus']} CPUs; {', '.join([*versions, *extra])}; "
        f"load average {load}"
    )


def finish(
    json_path: Path | None, figures: Mapping[str, Any], timed: Mapping[str, Timed] | None = None
) -> None:
    """A benchmark's last lines: :func:`machine_line`, then (with ``--json``) the run — command,
    time, machine — its ``figures`` and every timed job's runs written to ``json_path``."""
    print(machine_line())
    if json_path is not None:
        write_json(json_path, figures, timed)


def write_json(
    path: Path, figures: Mapping[str, Any], timed: Mapping[str, Timed] | None = None
) -> None:
    """The run (command, time, machine), ``figures`` and every timed job's runs, to ``path``."""
    out = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **figures,
        "timings": {name: times.figures() for name, times in (timed or {}).items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"written: {path}")


def options(
    ap: argparse.ArgumentParser,
    *,
    repeat: int,
    clock: Clock | None = "wall",
    threads: int | None = 2,
) -> None:
    """The flags of a timing benchmark: ``--repeat`` (also spelt ``--repeats``) rounds of its
    jobs, ``--clock`` it reports on (none where it reports both), torch's ``--threads``, and
    ``--json`` to keep the figures."""
    rounds = f"timed rounds after the warm-up (default {repeat})"
    ap.add_argument("--repeat", "--repeats", dest="repeat", type=int, default=repeat, help=rounds)
    if clock is not None:
        which = f"wall time, or the process's CPU time (steadier on a shared machine; {clock})"
        ap.add_argument("--clock", choices=CLOCKS, default=clock, help=which)
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads, help="torch's CPU threads")
    ap.add_argument("--json", type=Path, help="also write the figures and the machine here")


def parse(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The flags, with torch's CPU threads set to ``--threads`` where the benchmark takes it
    from :func:`options` (one count; a benchmark's own ``--threads`` of several is its own)."""
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, not {args.repeat}")
    if isinstance(getattr(args, "threads", None), int):
        import torch

        torch.set_num_threads(args.threads)
    return args
