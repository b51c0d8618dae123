"""What the benchmarks share (bench/harness.py, bench/throwaway_db.py) does what their figures rest
on: jobs timed round by round after a warm-up, the statistics and ratios of their runs, and a
database that is the run's own and gone after it."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import create_engine, make_url, text

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return _load("harness")


@pytest.fixture(scope="module")
def throwaway_db() -> ModuleType:
    return _load("throwaway_db")


def test_jobs_run_round_by_round_after_a_warm_up_each(harness: ModuleType) -> None:
    calls: list[str] = []
    jobs = {name: (lambda name=name: calls.append(name) or f"{name}{len(calls)}") for name in "ab"}
    timed = harness.interleaved(jobs, 3)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert [len(timed[k].wall) for k in "ab"] == [3, 3] and len(timed["a"].cpu) == 3
    assert timed["a"].result == "a7" and timed["b"].result == "b8"  # each job's last run's
    calls.clear()
    harness.interleaved(jobs, 2, warm_up=False)
    assert calls == ["a", "b", "a", "b"]


def test_the_figures_are_the_runs_statistics(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clock that advances by the lengths given, one reading at each start and end of a run:
    # job a's runs take 1, 5 and 3 s, job b's 2, 2 and 8 s (wall); CPU time a tenth of that.
    lengths = [1, 2, 5, 2, 3, 8]
    readings = list(itertools.accumulate(x for d in lengths for x in (0, d)))
    wall, cpu = iter(readings), iter(r / 10 for r in readings)
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(harness.time, "process_time", lambda: next(cpu))
    timed = harness.interleaved({"a": lambda: None, "b": lambda: None}, 3, warm_up=False)
    assert timed["a"].wall == [1, 5, 3] and timed["b"].wall == [2, 2, 8]
    assert timed["a"].cpu == pytest.approx([0.1, 0.5, 0.3])
    assert [timed["a"].stat("wall", s) for s in ("median", "min", "max")] == [3, 1, 5]
    assert timed["b"].figures()["cpu"] == {
        "median": 0.2,
        "min": 0.2,
        "max": 0.8,
        "runs": [0.2, 0.2, 0.8],
    }
    lines = harness.table("job", timed, "wall", base="a").splitlines()
    assert lines[0] == "| job | median | min–max | ratio to a |"
    assert lines[2:] == [
        "| a | 3.000 s | 1.000–5.000 s | 1.00 |",
        "| b | 2.000 s | 2.000–8.000 s | 0.67 |",
    ]
    best = harness.table("job", timed, "cpu", base="a", stat="min").splitlines()
    assert best[3] == "| b | 0.200 s | 0.200–0.800 s | 2.00 |"  # 0.2 / 0.1
    noted = harness.table("job", timed, "wall", digits=1, notes=("loaded", {"a": "torch"}))
    assert noted.splitlines()[0] == "| job | median | min–max | loaded |"
    assert noted.splitlines()[1] == "|---|---:|---:|---|"
    assert noted.splitlines()[2:] == [
        "| a | 3.0 s | 1.0–5.0 s | torch |",
        "| b | 2.0 s | 2.0–8.0 s | — |",
    ]


def test_the_flags_and_a_repeat_below_one(
    harness: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ap = argparse.ArgumentParser()
    harness.options(ap, repeat=7, clock="cpu", threads=None)
    args = ap.parse_args(["--repeats", "3", "--json", str(tmp_path / "x.json")])
    assert (args.repeat, args.clock, args.json) == (3, "cpu", tmp_path / "x.json")
    assert not hasattr(args, "threads")
    monkeypatch.setattr(sys, "argv", ["bench", "--repeat", "0"])
    with pytest.raises(SystemExit) as stop:
        harness.parse(ap)
    assert stop.value.code == 2


def test_the_json_keeps_the_figures_with_the_machine(harness: ModuleType, tmp_path: Path) -> None:
    timed = {"a": harness.Timed(wall=[1.0, 3.0], cpu=[0.5, 0.7])}
    harness.finish(tmp_path / "out.json", {"job": "demo"}, timed)
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["job"] == "demo" and data["machine"]["cpus"] >= 1
    assert data["timings"]["a"]["wall"] == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [1, 3]}
    assert "load average" in harness.machine_line()


def test_sqlite_is_no_url(throwaway_db: ModuleType) -> None:
    with throwaway_db.throwaway_database("sqlite", "postgresql://ignored") as (url, what):
        assert (url, what) == (None, "SQLite file")


def test_a_fresh_database_on_a_server_is_the_runs_own_and_dropped_after(
    throwaway_db: ModuleType, postgres_url: str
) -> None:
    admin = create_engine(postgres_url)
    with admin.connect() as c:
        may = c.execute(
            text("SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user")
        ).scalar()
    if not may:
        admin.dispose()
        pytest.skip("the session's PostgreSQL user may not create databases")
    try:
        with throwaway_db.throwaway_database("postgresql", postgres_url) as (url, what):
            name = make_url(url).database
            assert what == "a fresh PostgreSQL database" and name != make_url(postgres_url).database
            engine = create_engine(url)
            with engine.begin() as c:
                assert c.execute(text("SELECT current_database()")).scalar() == name
                tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                assert c.execute(text(tables)).scalar() == 0
                c.execute(text("CREATE TABLE t (x int)"))
            engine.dispose()  # (a connection left open would not stop the drop: WITH FORCE)
        with admin.connect() as c:
            left = "SELECT count(*) FROM pg_database WHERE datname = :name"
            assert c.execute(text(left), {"name": name}).scalar() == 0
    finally:
        admin.dispose()


def test_an_unreachable_server_is_one_sentence(throwaway_db: ModuleType) -> None:
    from tests.servers import free_port

    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    refused = pytest.raises(throwaway_db.DatabaseUnavailable, match="unreachable")
    with refused, throwaway_db.throwaway_database("postgresql", nowhere):
        pass


def test_a_server_of_its_own_that_cannot_start_falls_back_to_sqlite_when_told(
    throwaway_db: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tests.servers

    def broken() -> None:
        raise RuntimeError("no binaries")

    monkeypatch.setattr(tests.servers, "PgServer", broken)
    notes: list[str] = []
    with throwaway_db.throwaway_database("postgresql", fallback=notes.append) as got:
        assert got == (None, "SQLite file")
    assert notes == ["PostgreSQL did not start here (RuntimeError: no binaries); SQLite"]
    refused = pytest.raises(throwaway_db.DatabaseUnavailable, match="did not start here")
    with refused, throwaway_db.throwaway_database("postgresql"):
        pass
