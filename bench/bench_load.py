"""Loopback load test of ``cka-atlas serve`` (issue 6, part 3), printed as a markdown table.

What it does, in order:

1. starts ``python -m app.cli serve`` (:mod:`service`) on a free loopback port, with a fresh
   temporary ``CKA_DATA_DIR``, a random write token, the in-process worker (one thread) and
   either the default SQLite file or a fresh database on the PostgreSQL server
   (``--db postgresql``; dropped again at the end: :mod:`throwaway_db`);
2. uploads randomly initialised checkpoints of the five ``*_digits`` presets (made here with
   ``models.create`` + ``models.save``; no training) through ``POST /v1/models``;
3. computes comparison A (the five models over the built-in digits, 450 images), waits for
   it, and fetches its heatmaps once so the PNG and SVG are in the artifact store;
4. uploads a random ``.npz`` of 8x8 images sized from A's job time so that comparison B (the
   same five models over it, no stored Grams to reuse) needs about 2x the load duration on
   an otherwise idle server, and queues B;
5. runs ``--clients`` closed-loop clients (asyncio + one httpx connection pool, keep-alive,
   no think time unless ``--think-ms``) for ``--duration`` seconds. Each request picks one of
   six groups with equal probability: the lists (``/v1/comparisons``, ``/v1/models``,
   ``/v1/datasets`` in turn), one comparison (A or B), A's matrix JSON for a random model
   pair, A's heatmap PNG, A's heatmap SVG (half of the heatmap requests revalidate with
   ``If-None-Match`` and expect 304, as a browser does), and the web page ``/``;
6. reports per group the requests, throughput, p50 and p99 latency and errors (a status
   other than 2xx/304, a wrong content type, or an exception such as a timeout), whether
   comparison B kept running during the load, and whether it then finished.

Latency is measured in the client, from sending the request to having read the whole body.
Client and server share the machine: on a 2-core host the client's own event loop takes a
part of the CPU, so the figures are an upper bound on what the server alone would show.

    .venv/bin/python bench/bench_load.py                      # 50 clients, 60 s, SQLite
    .venv/bin/python bench/bench_load.py --db postgresql      # the same against PostgreSQL
    .venv/bin/python bench/bench_load.py --quick              # smoke run: 10 clients, 10 s

PostgreSQL is the server at ``postgresql+psycopg://postgres@127.0.0.1:5432/test`` (or
``$CKA_TEST_POSTGRES_URL``, or ``--pg-url``), whose user may create databases; the run uses a
database of its own there and drops it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, service.py and throwaway_db.py, beside this script
import httpx
import numpy as np
from service import ServerError, serve
from throwaway_db import DatabaseUnavailable, throwaway_database

PRESETS = ("mixer_digits", "sw_mlp_digits", "rp_mixer_digits", "gmlp_digits", "mlp_digits")
GROUPS = ("lists", "comparison", "matrix", "heatmap.png", "heatmap.svg", "page /")
CACHED = ("matrix", "heatmap.png", "heatmap.svg")
TARGET_P99_MS = 100.0
PG_ADMIN = os.environ.get(
    "CKA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
FINAL = ("succeeded", "failed", "cancelled")
DIGITS_IMAGES = 450  # the built-in digits dataset (its test split)
BATCH = 150


class SetupError(RuntimeError):
    """The server or its fixtures could not be brought up; the message says why."""


# --------------------------------------------------------------------------- fixtures


def make_checkpoints(out: Path) -> dict[str, Path]:
    import torch

    import models

    torch.manual_seed(0)
    return {name: models.save(models.create(name), out / f"{name}.safetensors") for name in PRESETS}


def upload_model(client: httpx.Client, path: Path) -> int:
    with path.open("rb") as w, path.with_suffix(".json").open("rb") as s:
        files = {"weights": ("w.safetensors", w), "sidecar": ("s.json", s)}
        r = client.post("/v1/models", files=files, data={"name": path.stem})
    if r.status_code not in (200, 201):
        raise SetupError(f"uploading {path.name} answered {r.status_code}: {r.text[:300]}")
    return int(r.json()["id"])


def upload_dataset(client: httpx.Client, n: int, path: Path) -> int:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)
    y = rng.integers(0, 10, n, dtype=np.int64)
    np.savez(path, x=x, y=y)
    with path.open("rb") as f:
        r = client.post("/v1/datasets", files={"file": ("bench.npz", f)}, data={"name": "bench"})
    if r.status_code not in (200, 201):
        raise SetupError(f"uploading the dataset answered {r.status_code}: {r.text[:300]}")
    return int(r.json()["id"])


def submit(client: httpx.Client, model_ids: list[int], dataset_id: int) -> int:
    body = {"model_ids": model_ids, "dataset_id": dataset_id, "batch_size": BATCH}
    r = client.post("/v1/comparisons", json=body)
    if r.status_code not in (200, 202):
        raise SetupError(f"submitting a comparison answered {r.status_code}: {r.text[:300]}")
    return int(r.json()["id"])


def wait_final(client: httpx.Client, cid: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/v1/comparisons/{cid}").json()
        if body["status"] in FINAL or time.monotonic() > deadline:
            return body
        time.sleep(0.25)


def job_seconds(body: dict[str, Any]) -> float:
    from datetime import datetime

    started, finished = body.get("started_at"), body.get("finished_at")
    if not started or not finished:
        return float("nan")
    return (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()


# --------------------------------------------------------------------------- load


@dataclass
class Plan:
    """The URLs the clients read."""

    done: int
    running: int
    labels: list[str]
    etags: dict[str, str]

    def pick(self, rng: random.Random, i: int) -> tuple[str, str, dict[str, str], str | None]:
        """(group, url, headers, expected content type prefix) of one request."""
        group = rng.choice(GROUPS)
        base = f"/v1/comparisons/{self.done}"
        if group == "lists":
            url = ("/v1/comparisons", "/v1/models", "/v1/datasets")[i % 3]
            return group, url, {}, "application/json"
        if group == "comparison":
            cid = self.done if rng.random() < 0.5 else self.running
            return group, f"/v1/comparisons/{cid}", {}, "application/json"
        if group == "matrix":
            a, b = rng.choice(self.labels), rng.choice(self.labels)
            return group, f"{base}/matrix?a={a}&b={b}", {}, "application/json"
        if group == "page /":
            return group, "/", {}, "text/html"
        fmt = group.split(".")[1]
        headers = {"If-None-Match": self.etags[fmt]} if rng.random() < 0.5 else {}
        return group, f"{base}/heatmap.{fmt}", headers, "image/"


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {g: [] for g in GROUPS})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0))
    not_modified: int = 0
    examples: dict[str, int] = field(default_factory=dict)

    def error(self, group: str, what: str) -> None:
        self.errors[group] += 1
        self.examples[f"{group}: {what}"] = self.examples.get(f"{group}: {what}", 0) + 1


async def client_loop(
    client: httpx.AsyncClient, plan: Plan, stats: Stats, stop_at: float, seed: int, think: float
) -> None:
    rng = random.Random(seed)
    i = seed
    if think > 0:  # users arrive spread over one think time, not all in the same millisecond
        await asyncio.sleep(rng.uniform(0, think))
    while time.perf_counter() < stop_at:
        group, url, headers, ctype = plan.pick(rng, i)
        i += 1
        start = time.perf_counter()
        try:
            r = await client.get(url, headers=headers)
        except Exception as exc:  # a timeout or a dropped connection counts as an error
            stats.latencies[group].append(time.perf_counter() - start)
            stats.error(group, type(exc).__name__)
            continue
        stats.latencies[group].append(time.perf_counter() - start)
        if r.status_code == 304:
            stats.not_modified += 1
        elif not 200 <= r.status_code < 300:
            stats.error(group, f"HTTP {r.status_code}")
        elif ctype and not r.headers.get("content-type", "").startswith(ctype):
            stats.error(group, f"content-type {r.headers.get('content-type')!r}")
        elif not r.content:
            stats.error(group, "empty body")
        if think > 0:
            await asyncio.sleep(rng.expovariate(1.0 / think))


@dataclass
class Watch:
    """Comparison B as seen once a second during the load."""

    samples: list[tuple[float, str, float]] = field(default_factory=list)


async def watch_loop(client: httpx.AsyncClient, cid: int, watch: Watch, stop_at: float) -> None:
    while True:
        try:
            body = (await client.get(f"/v1/comparisons/{cid}")).json()
            watch.samples.append((time.perf_counter(), body["status"], float(body["progress"])))
        except Exception as exc:
            watch.samples.append((time.perf_counter(), f"poll error {type(exc).__name__}", -1.0))
        if time.perf_counter() >= stop_at:
            return
        await asyncio.sleep(min(1.0, max(stop_at - time.perf_counter(), 0.0)))


async def run_load(
    base: str, plan: Plan, clients: int, duration: float, think: float
) -> tuple[Stats, Watch, float]:
    stats, watch = Stats(), Watch()
    # Idle connections are dropped after 2 s, before uvicorn's own 5 s keep-alive timeout: with
    # equal timeouts (httpx's default is also 5 s) the server may close a connection at the
    # instant the client reuses it, a race that browsers hide by retrying and httpx does not.
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0
    )
    async with (
        httpx.AsyncClient(base_url=base, limits=limits, timeout=30.0) as client,
        httpx.AsyncClient(base_url=base, timeout=30.0) as monitor,
    ):
        start = time.perf_counter()
        stop_at = start + duration
        await asyncio.gather(
            watch_loop(monitor, plan.running, watch, stop_at),
            *(client_loop(client, plan, stats, stop_at, k, think) for k in range(clients)),
        )
        elapsed = time.perf_counter() - start
    return stats, watch, elapsed


# --------------------------------------------------------------------------- report


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (q in [0, 1])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(np.ceil(q * len(ordered)))))
    return ordered[rank - 1]


def table(stats: Stats, elapsed: float) -> tuple[str, dict[str, dict[str, float]]]:
    rows, summary = [], {}
    every = [v for g in GROUPS for v in stats.latencies[g]]
    for name, values, errors in [
        *((g, stats.latencies[g], stats.errors[g]) for g in GROUPS),
        ("**all**", every, sum(stats.errors.values())),
    ]:
        n = len(values)
        p50, p99 = percentile(values, 0.50) * 1e3, percentile(values, 0.99) * 1e3
        summary[name.strip("*")] = {
            "requests": n,
            "rps": n / elapsed,
            "p50_ms": p50,
            "p99_ms": p99,
            "errors": errors,
        }
        rows.append(f"| {name} | {n} | {n / elapsed:.1f} | {p50:.1f} | {p99:.1f} | {errors} |")
    head = (
        "| endpoint group | requests | throughput (req/s) | p50 (ms) | p99 (ms) | errors |\n"
        "|---|---:|---:|---:|---:|---:|"
    )
    return head + "\n" + "\n".join(rows), summary


def background_verdict(watch: Watch, final: dict[str, Any], waited: float) -> tuple[str, bool]:
    during = watch.samples
    running = [s for s in during if s[1] == "running"]
    statuses = sorted({s[1] for s in during})
    first = next((s[2] for s in during if s[2] >= 0), float("nan"))
    last = next((s[2] for s in reversed(during) if s[2] >= 0), float("nan"))
    kept = bool(during) and len(running) == len(during)
    line = (
        f"comparison B during the load: {len(running)}/{len(during)} once-a-second samples "
        f"'running' (statuses seen: {', '.join(statuses) or 'none'}), progress "
        f"{first:.1%} -> {last:.1%}; "
    )
    if final["status"] == "succeeded":
        line += (
            f"afterwards it succeeded {waited:.0f} s after the load ended "
            f"(job time {job_seconds(final):.0f} s)."
        )
    elif final["status"] not in FINAL:
        line += (
            f"it was still {final['status']} at {final['progress']:.1%} when the wait of "
            f"{waited:.0f} s after the load ran out, and was cancelled."
        )
    else:
        line += f"afterwards it ended as '{final['status']}' (error: {final.get('error')})."
    return line, kept and final["status"] == "succeeded"


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--pg-url", default=PG_ADMIN, help="PostgreSQL admin URL for --db postgresql")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 clients for 10 s")
    ap.add_argument(
        "--think-ms", type=float, default=0.0, help="mean think time between a client's requests"
    )
    ap.add_argument(
        "--worker",
        choices=("thread", "process"),
        default="thread",
        help="run jobs in the API process (thread, the laptop default) or in a separate "
        "`cka-atlas worker` process polling the database (process, as on a GPU host)",
    )
    ap.add_argument("--device", default="cpu", help="CKA_DEVICE of the server (default cpu)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    if args.quick:
        args.clients, args.duration = 10, 10.0
    if args.clients < 1 or args.duration <= 0:
        ap.error("--clients must be >= 1 and --duration > 0")

    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    token = secrets.token_hex(16)
    try:
        return run(args, tmp, token)
    except (SetupError, ServerError, DatabaseUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, tmp: Path, token: str) -> int:
    log("making checkpoints of the five *_digits presets (random weights)")
    zoo = make_checkpoints(tmp / "zoo")
    with (
        throwaway_database(args.db, args.pg_url) as (db_url, _),
        serve(
            tmp / "data",
            {
                "CKA_API_TOKENS": token,
                "CKA_DEVICE": args.device,
                "CKA_WORKER_THREADS": "1" if args.worker == "thread" else "0",
                **({"CKA_DATABASE_URL": db_url} if db_url else {}),
            },
            worker_process=args.worker == "process",
        ) as server,
        httpx.Client(
            base_url=server.base, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as api,
    ):
        log(f"server up at {server.base} ({args.db})")
        ids = [upload_model(api, zoo[name]) for name in PRESETS]
        digits = next(d for d in api.get("/v1/datasets").json()["items"] if d["builtin"])
        done = submit(api, ids, int(digits["id"]))
        a = wait_final(api, done, timeout=600)
        if a["status"] != "succeeded":
            raise SetupError(f"comparison A ended as {a['status']}: {a.get('error')}")
        per_image = max(job_seconds(a), 0.5) / DIGITS_IMAGES
        log(f"comparison A ({done}) took {job_seconds(a):.1f} s for {DIGITS_IMAGES} images")
        labels = [m["label"] for m in a["models"]]
        etags = {}
        for fmt in ("png", "svg"):  # rendered once here, then served from the artifact store
            r = api.get(f"/v1/comparisons/{done}/heatmap.{fmt}")
            if r.status_code != 200:
                raise SetupError(f"heatmap.{fmt} answered {r.status_code}: {r.text[:300]}")
            etags[fmt] = r.headers["etag"]
        # A's job time includes loading the checkpoints, which B does not repeat: the
        # factor 2 keeps B running through the load even on an idle machine.
        n_slow = int(min(max(2 * args.duration / per_image, 2 * DIGITS_IMAGES), 400_000))
        n_slow -= n_slow % BATCH
        slow_ds = upload_dataset(api, n_slow, tmp / "bench.npz")
        running = submit(api, ids, slow_ds)
        b = wait_running(api, running)
        log(f"comparison B ({running}) over {n_slow} random images is {b['status']}")
        plan = Plan(done, running, labels, etags)
        warm = random.Random(0)
        for _ in range(30):  # a few requests of every kind before the clock starts
            _group, url, headers, _ctype = plan.pick(warm, _)
            api.get(url, headers=headers)
        log(f"load: {args.clients} clients for {args.duration:.0f} s")
        cpu0, rusage0 = server.cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF)
        load_before = harness.machine_line(f"httpx {httpx.__version__}")
        stats, watch, elapsed = asyncio.run(
            run_load(server.base, plan, args.clients, args.duration, args.think_ms / 1e3)
        )
        cpu1, rusage1 = server.cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF)
        load_after = harness.machine_line(f"httpx {httpx.__version__}")
        log("load done; waiting for comparison B to finish")
        t_end = time.perf_counter()
        final = wait_final(api, running, timeout=max(300.0, 5 * args.duration))
        waited = time.perf_counter() - t_end
        if final["status"] not in FINAL:
            api.post(f"/v1/comparisons/{running}/cancel")
        server_errors = server.error_lines()

    text, summary = table(stats, elapsed)
    every = [v for g in GROUPS for v in stats.latencies[g]]
    verdict, bg_ok = background_verdict(watch, final, waited)
    cached_p99 = max(summary[g]["p99_ms"] for g in CACHED)
    total_errors = int(summary["all"]["errors"])
    client_cpu = (rusage1.ru_utime + rusage1.ru_stime) - (rusage0.ru_utime + rusage0.ru_stime)
    server_cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else float("nan")
    print(
        f"## Load: {args.clients} clients, {args.duration:.0f} s, {args.db}"
        f"{f', think {args.think_ms:.0f} ms' if args.think_ms else ''}\n"
    )
    print(text)
    print()
    print(f"- heatmap requests answered 304 (If-None-Match): {stats.not_modified}")
    if stats.examples:
        shown = "; ".join(f"{k} x{v}" for k, v in sorted(stats.examples.items()))
        print(f"- errors: {shown}")
    print(f"- {verdict}")
    print(f"- server log lines at level error: {len(server_errors)}")
    print(
        f"- CPU during the load ({elapsed:.1f} s): server {server_cpu:.1f} s, "
        f"load client {client_cpu:.1f} s"
    )
    if not args.think_ms:
        mean_ms = 1e3 * sum(sum(v) for v in stats.latencies.values()) / max(len(every), 1)
        print(
            f"- closed loop without think time: mean latency {mean_ms:.1f} ms ~ clients / "
            f"throughput = {1e3 * args.clients * elapsed / max(len(every), 1):.1f} ms "
            "(Little's law): latency here is mostly queueing for the server"
        )
    print(f"- machine before: {load_before}")
    print(f"- machine after: {load_after}")
    ok_err = total_errors == 0
    ok_p99 = cached_p99 < TARGET_P99_MS
    print(
        f"- target: zero errors {'met' if ok_err else 'MISSED'} ({total_errors}); p99 of "
        f"cached matrix/heatmaps < {TARGET_P99_MS:.0f} ms {'met' if ok_p99 else 'MISSED'} "
        f"(worst {cached_p99:.1f} ms); background comparison kept running and finished: "
        f"{'yes' if bg_ok else 'NO'}"
    )
    for line in server_errors[:5]:
        print(f"  server: {line[:300]}")
    figures = {
        "clients": args.clients,
        "duration_s": args.duration,
        "elapsed_s": elapsed,
        "db": args.db,
        "think_ms": args.think_ms,
        "groups": summary,
        "not_modified": stats.not_modified,
        "error_examples": stats.examples,
        "background": verdict,
        "background_ok": bg_ok,
        "server_error_lines": len(server_errors),
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
        "machine_before": load_before,
        "machine_after": load_after,
    }
    if args.json:
        harness.write_json(args.json, figures)
    return 0


def wait_running(client: httpx.Client, cid: int, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until the worker has claimed comparison ``cid`` (or it ended)."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/v1/comparisons/{cid}").json()
        if body["status"] != "queued" or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
