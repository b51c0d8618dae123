"""A study on 1 and on 2 Celery workers: wall time, speed-up, efficiency, and the costs the
BENCHMARKS.md cost model uses.

Everything goes through the product: a throwaway store (SQLite file and artifact directory)
per worker count, so nothing is reused; the REST app (which only enqueues when a broker is
set); Redis; and real ``cka-atlas worker --name`` processes with one thread each. The study is
the built-in ``sparsity`` with ``--seeds`` seeds and its quick recipe (``--quick``, as
``cka-atlas study run sparsity --quick --seeds 2``). Before any clock the study is posted once
to an app without workers (:func:`warm_up`), and each run's app answers one request. Wall time
is from the POST until the study's job finished, as its row records it; the client polls once
a second (``--poll``), and what it adds is shown apart ("seen by the client"): on two cores a
client polling five times a second took a CPU-second per run from the workers it was timing.
Each training's seconds are its job's own
(``/v1/jobs?parent_id=``: the training, then the pass that stores its model's Grams for the
atlas), the atlas's from its job's start and end. Last, the phases of each run from the job
rows' timestamps: what does not split over workers (delivery, planning, hand-offs, the atlas,
the summary, the client's poll) and the trainings' span, with the time the workers stood idle
in it. ``--logs DIR`` keeps the workers' logs (level info, one JSON object a line, timestamped).

    .venv/bin/python bench/bench_study_workers.py                # Redis at 127.0.0.1:6379/15
    .venv/bin/python bench/bench_study_workers.py --redis redis://host:6379/3 --seeds 3
    .venv/bin/python bench/bench_study_workers.py --repeat 3     # 1, 2, 1, 2, 1, 2 workers
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness  # bench/harness.py and throwaway_db.py, beside this script
from fastapi.testclient import TestClient
from throwaway_db import throwaway_database

from app.http.main import create_app
from app.jobs.celery_process import celery_workers, own_store, worker_logs


def _utc(when: datetime) -> datetime:
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def timeline(services: Any, study_job: int, posted: datetime, answered: float) -> dict[str, float]:
    """Seconds of each phase of a finished study, from its job rows' timestamps: what does not
    split over workers (delivery, planning, hand-offs, the atlas, the summary) and the
    trainings' span with the time the workers stood idle in it."""
    from sqlalchemy import select

    from app.store.orm import Job

    with services.db.session(readonly=True) as s:
        study = s.get(Job, study_job)
        kids = list(s.scalars(select(Job).where(Job.parent_id == study_job).order_by(Job.id)))
        rows = [(j.kind, j.worker_id, j.created_at, j.started_at, j.finished_at) for j in kids]
        s_start, s_end = _utc(study.started_at), _utc(study.finished_at)
    t = [(w, _utc(c), _utc(a), _utc(b)) for k, w, c, a, b in rows if k == "training"]
    atlas = [(_utc(c), _utc(a), _utc(b)) for k, _, c, a, b in rows if k == "comparison"]
    out = {
        "delivery of the study": (s_start - posted).total_seconds(),
        "  of which the POST's answer": answered,
    }
    if t:
        first_start, last_end = min(r[2] for r in t), max(r[3] for r in t)
        out["planning (study start to trainings queued)"] = (t[0][1] - s_start).total_seconds()
        out["trainings queued to first start"] = (first_start - t[0][1]).total_seconds()
        span = (last_end - first_start).total_seconds()
        busy = sum((b - a).total_seconds() for _, _, a, b in t)
        workers = len({w for w, *_ in t})
        out["trainings span"] = span
        out["  of which workers idle (worker-s)"] = workers * span - busy
        after = last_end
    else:
        after = s_start
    if atlas:
        created, started, ended = atlas[0]
        out["last training to atlas queued"] = (created - after).total_seconds()
        out["atlas queued to started"] = (started - created).total_seconds()
        out["atlas"] = (ended - started).total_seconds()
        after = ended
    out["summary (atlas end to study end)"] = (s_end - after).total_seconds()
    out["_end"] = (s_end - posted).total_seconds()
    return out


def _seconds(job: dict[str, Any]) -> float:
    began, ended = (datetime.fromisoformat(job[k]) for k in ("started_at", "finished_at"))
    return (ended - began).total_seconds()


def _body(args: argparse.Namespace) -> dict[str, Any]:
    return {"builtin": args.study, "seeds": args.seeds, "quick": args.quick}


def warm_up(args: argparse.Namespace) -> None:
    """The study posted once to an app without broker or worker (nothing runs), so that the
    process's first-use costs (the datasets' loader, each model's memory budget, kept per
    process) fall before any clock and on neither run: a running API has paid them long ago."""
    with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
        settings = own_store(Path(tmp), args.redis).model_copy(update={"broker_url": None})
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            client.post("/v1/studies", json=_body(args)).raise_for_status()


def run(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-study-") as tmp,
        throwaway_database("postgresql" if args.postgres else "sqlite", args.postgres) as (url, _),
    ):
        root = Path(tmp)
        settings = own_store(root, args.redis, url)
        if args.logs:
            settings = settings.model_copy(update={"log_level": "info"})
        names = [f"bench{i}" for i in range(workers)]
        with (
            TestClient(create_app(settings), base_url="http://localhost") as client,
            celery_workers(settings, root, names) as procs,
        ):
            client.get("/v1/studies").raise_for_status()  # an app's first answer is slower
            posted = datetime.now(UTC)
            began = time.perf_counter()
            r = client.post("/v1/studies", json=_body(args))
            answered = time.perf_counter() - began
            r.raise_for_status()
            url = r.headers["location"]
            while (state := client.get(url).json())["status"] in ("queued", "running"):
                time.sleep(args.poll)
            seen = time.perf_counter() - began
            children = client.get(
                "/v1/jobs", params={"parent_id": state["job_id"], "limit": 500}
            ).json()["items"]
            services = client.app.state.services  # type: ignore[attr-defined]
            phases = timeline(services, state["job_id"], posted, answered)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for name, text in worker_logs(root, procs).items():
                (args.logs / f"{workers}-{name}.log").write_text(text)
        if state["status"] != "succeeded":
            raise SystemExit(f"the study ended {state['status']}: {state.get('error')}")
        trainings = [c for c in children if c["kind"] == "training"]
        atlas = [c for c in children if c["kind"] == "comparison"]
        end = phases.pop("_end")
        return {
            "workers": workers,
            "wall": end,
            "trainings": [
                (
                    c["detail"]["worker"].split(":")[0],
                    c["detail"].get("training_seconds", c["detail"]["seconds"]),
                    (c["detail"].get("grams") or {}).get("seconds", 0.0),
                )
                for c in trainings
            ],
            "atlas": _seconds(atlas[0]) if atlas else float("nan"),
            "models": len(state["models"]),
            "phases": phases | {"seen by the client": seen - end},
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    ap.add_argument("--study", default="sparsity")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--quick", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--logs", type=Path, help="keep the workers' logs (level info) here")
    ap.add_argument(
        "--postgres",
        metavar="URL",
        help="a PostgreSQL server (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test): each "
        "run gets a fresh database there instead of a SQLite file, as on a GPU host",
    )
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between the client's polls")
    ap.add_argument("--repeat", type=int, default=1, help="run the worker counts this many times")
    args = ap.parse_args()
    warm_up(args)
    speedups: dict[int, list[float]] = {}
    for _ in range(args.repeat):
        rows = [run(w, args) for w in args.workers]
        report(args, rows)
        for r in rows[1:]:
            speedups.setdefault(r["workers"], []).append(speed_up(rows[0], r))
    if args.repeat > 1:
        for workers, values in speedups.items():
            listed = ", ".join(f"{v:.2f}" for v in values)
            middle = statistics.median(values)
            print(f"\nspeed-up of {workers} workers: {listed}; median {middle:.2f}")
    print(harness.machine_line())


def speed_up(first: dict[str, Any], row: dict[str, Any]) -> float:
    """``row``'s speed-up over the run of the first worker count (1 by default), in workers."""
    return float(first["wall"] / row["wall"] * first["workers"])


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """One pass over the worker counts: the table, the trainings per worker, the phases."""
    print(f"\n{args.study}, {args.seeds} seeds, quick={args.quick}: {rows[0]['models']} trainings")
    print(
        "| workers | wall (s) | speed-up | efficiency | training s (mean, min–max) "
        "| Grams for the atlas s (sum) | atlas s | seen by the client (s) |"
    )
    print("|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        speed = speed_up(rows[0], r)
        secs = [s for _, s, _ in r["trainings"]]
        spread = f"{sum(secs) / len(secs):.1f} ({min(secs):.1f}–{max(secs):.1f})"
        grams = sum(g for *_, g in r["trainings"])
        print(
            f"| {r['workers']} | {r['wall']:.1f} | {speed:.2f} | "
            f"{speed / r['workers']:.0%} | {spread} | {grams:.1f} | {r['atlas']:.1f} | "
            f"{r['wall'] + r['phases']['seen by the client']:.1f} |"
        )
    for r in rows:
        per: dict[str, int] = {}
        for name, *_ in r["trainings"]:
            per[name] = per.get(name, 0) + 1
        print(f"{r['workers']} worker(s): trainings per worker {per}")
    print("\nphases (s):", " | ".join(f"{r['workers']} worker(s)" for r in rows))
    for phase in rows[0]["phases"]:
        print(f"  {phase}: " + " | ".join(f"{r['phases'].get(phase, 0.0):.2f}" for r in rows))


if __name__ == "__main__":
    main()
