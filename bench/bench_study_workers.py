"""A study on 1 and on 2 Celery workers: wall time, speed-up, efficiency, and the costs the
BENCHMARKS.md cost model uses.

Everything goes through the product: a throwaway store (SQLite file and artifact directory)
per worker count, so nothing is reused; the REST app (which only enqueues when a broker is
set); Redis; and real ``cka-atlas worker --name`` processes with one thread each. The study is
the built-in ``sparsity`` with ``--seeds`` seeds and its quick recipe (``--quick``, as
``cka-atlas study run sparsity --quick --seeds 2``). Wall time is from the POST until the
study reads succeeded; each training's seconds are its job's own (``/v1/jobs?parent_id=``),
the atlas's from its job's start and end.

    .venv/bin/python bench/bench_study_workers.py                # Redis at 127.0.0.1:6379/15
    .venv/bin/python bench/bench_study_workers.py --redis redis://host:6379/3 --seeds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.http.main import create_app
from app.store.settings import Settings


def start_worker(settings: Settings, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "CKA_DATABASE_URL": settings.resolved_database_url,
        "CKA_DATA_DIR": str(settings.data_dir),
        "CKA_BROKER_URL": str(settings.broker_url),
        "CKA_CELERY_QUEUE": settings.celery_queue,
        "CKA_DEVICE": "cpu",
        "CKA_LOG_LEVEL": "warning",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--name", name],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _seconds(job: dict[str, Any]) -> float:
    from datetime import datetime

    began, ended = (datetime.fromisoformat(job[k]) for k in ("started_at", "finished_at"))
    return (ended - began).total_seconds()


def run(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
        root = Path(tmp)
        settings = Settings(
            database_url=f"sqlite:///{root / 'cka.db'}",
            data_dir=root / "data",
            broker_url=args.redis,
            celery_queue=f"bench-{uuid.uuid4().hex[:8]}",
            device="cpu",
            api_tokens="",
            worker_threads=0,
        )
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            procs = [
                start_worker(settings, f"bench{i}", root / f"w{i}.log") for i in range(workers)
            ]
            try:
                time.sleep(args.settle)  # workers import torch and connect before the clock
                began = time.perf_counter()
                body = {"builtin": args.study, "seeds": args.seeds, "quick": args.quick}
                r = client.post("/v1/studies", json=body)
                r.raise_for_status()
                url = r.headers["location"]
                while (state := client.get(url).json())["status"] in ("queued", "running"):
                    time.sleep(0.2)
                wall = time.perf_counter() - began
                children = client.get(
                    "/v1/jobs", params={"parent_id": state["job_id"], "limit": 500}
                ).json()["items"]
            finally:
                for p in procs:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=60)
        if state["status"] != "succeeded":
            raise SystemExit(f"the study ended {state['status']}: {state.get('error')}")
        trainings = [c for c in children if c["kind"] == "training"]
        atlas = [c for c in children if c["kind"] == "comparison"]
        return {
            "workers": workers,
            "wall": wall,
            "trainings": [
                (c["detail"]["worker"].split(":")[0], c["detail"]["seconds"]) for c in trainings
            ],
            "atlas": _seconds(atlas[0]) if atlas else float("nan"),
            "models": len(state["models"]),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    ap.add_argument("--study", default="sparsity")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--quick", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--settle", type=float, default=15.0, help="seconds to let workers start")
    args = ap.parse_args()
    rows = [run(w, args) for w in args.workers]
    base = rows[0]["wall"]  # the first worker count (1 by default) is the reference
    print(f"\n{args.study}, {args.seeds} seeds, quick={args.quick}: {rows[0]['models']} trainings")
    print("| workers | wall (s) | speed-up | efficiency | training s (mean, min–max) | atlas s |")
    print("|---:|---:|---:|---:|---|---:|")
    for r in rows:
        speed = base / r["wall"] * rows[0]["workers"]
        secs = [s for _, s in r["trainings"]]
        spread = f"{sum(secs) / len(secs):.1f} ({min(secs):.1f}–{max(secs):.1f})"
        print(
            f"| {r['workers']} | {r['wall']:.1f} | {speed:.2f} | "
            f"{speed / r['workers']:.0%} | {spread} | {r['atlas']:.1f} |"
        )
    for r in rows:
        per: dict[str, int] = {}
        for name, _ in r["trainings"]:
            per[name] = per.get(name, 0) + 1
        print(f"{r['workers']} worker(s): trainings per worker {per}")


if __name__ == "__main__":
    main()
