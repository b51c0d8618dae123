"""One sharded comparison on 1 and on 2 Celery workers: wall time, speed-up, efficiency.

Everything goes through the product: a throwaway store (SQLite file and artifact directory),
the REST app (which only enqueues when a broker is set), Redis, and real ``cka-atlas worker
--name`` processes with one thread each. The workload is two random-init 224-pixel timm models
(``mixer_s16_224`` and ``resmlp_12_224``, 10 classes) imported as Hugging Face folders, over an
image folder of ``--images`` random photos, batches of ``--batch``, in ``--shards`` shards.
Each worker count starts from an empty store, so no run reuses another's Grams. Wall time is
from the POST until the comparison reads succeeded.

It also prints the per-batch costs the cost model in BENCHMARKS.md uses: one forward pass per
model, the Gram products and the HSIC matrix of a batch, measured in this process (1 thread),
interleaved after a warm-up each (:func:`harness.interleaved`; median of ``--repeat``).

The sharded comparison itself is one run per worker count, timed from the POST until the
status poll (every 0.1 s) reads succeeded — the workers are other processes and a run the
whole of a store's life, so it is no job to repeat in turns; it takes the machine line and
``--json PATH`` from :mod:`harness`.

    .venv/bin/python bench/bench_shards.py                # Redis at 127.0.0.1:6379
    .venv/bin/python bench/bench_shards.py --redis redis://host:6379/3 --images 512
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script
import torch
from fastapi.testclient import TestClient
from workloads import TIMM_PAIR as MODELS
from workloads import hub_zip, photos_zip, timm_model

from analysis.estimators.hsic import hsic_from_grams
from analysis.estimators.kernels import gram, parse_kernel
from app.http.main import create_app
from app.jobs.celery_process import celery_workers, own_store


def run(
    workers: int, shards: int, args: argparse.Namespace, zips: dict[str, bytes], photos: bytes
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
        root = Path(tmp)
        settings = own_store(root, args.redis)
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            ids = []
            for name, blob in zips.items():
                r = client.post("/v1/models", files={"hub": (f"{name}.zip", blob)})
                r.raise_for_status()
                ids.append(r.json()["id"])
            r = client.post("/v1/datasets", files={"file": ("photos.zip", photos)})
            r.raise_for_status()
            body = {"model_ids": ids, "dataset_id": r.json()["id"], "batch_size": args.batch}
            with celery_workers(settings, root, [f"bench{i}" for i in range(workers)]):
                began = time.perf_counter()
                r = client.post("/v1/comparisons", json=body | {"shards": shards})
                r.raise_for_status()
                url = r.headers["location"]
                while (state := client.get(url).json())["status"] not in (
                    "succeeded",
                    "failed",
                    "cancelled",
                ):
                    time.sleep(0.1)
                wall = time.perf_counter() - began
        if state["status"] != "succeeded":
            raise SystemExit(f"the comparison ended {state['status']}: {state.get('error')}")
        parts = state["diagnostics"].get("shards", [])
        return {
            "workers": workers,
            "shards": shards,
            "wall": wall,
            "per_shard": [(p["worker"].split(":")[0], p["seconds"]) for p in parts],
            "layers": sum(len(v) for v in state["params"]["resolved_layers"].values()),
        }


def per_batch_costs(batch: int, layers: int, repeat: int) -> dict[str, harness.Timed]:
    """Seconds per batch, one thread: each model's forward, the Grams, the HSIC product."""
    torch.set_num_threads(1)
    x = torch.randn(batch, 3, 224, 224)
    nets: dict[str, Any] = {name: timm_model(name) for name in MODELS}  # timm's own methods

    def forward(model: Any) -> Any:
        with torch.inference_mode():
            return model.forward_intermediates(x)[1]

    kern = parse_kernel("linear")
    f = forward(nets[MODELS[-1]])[0].flatten(1)
    grams = torch.stack([gram(f, kern) for _ in range(layers)])
    jobs: dict[str, Any] = {f"forward {name}": (lambda m=m: forward(m)) for name, m in nets.items()}
    jobs["grams (all layers)"] = lambda: torch.stack([gram(f, kern) for _ in range(layers)])
    jobs["HSIC product"] = lambda: hsic_from_grams(grams, "unbiased")
    return harness.interleaved(jobs, repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    harness.options(ap, repeat=1, clock=None, threads=None)
    args = harness.parse(ap)
    with tempfile.TemporaryDirectory() as tmp:
        zips = {name: hub_zip(name, Path(tmp)) for name in MODELS}
    photos = photos_zip(args.images)
    rows = [run(w, args.shards, args, zips, photos) for w in args.workers]
    base = rows[0]["wall"]  # the first worker count (1 by default) is the reference
    print(f"\n{args.images} images, batch {args.batch}, {args.shards} shards, models {MODELS}")
    print("| workers | shards | wall (s) | speed-up | efficiency | shard seconds (worker) |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in rows:
        speed = base / r["wall"]
        shards = ", ".join(f"{s:.1f} ({w})" for w, s in r["per_shard"])
        print(
            f"| {r['workers']} | {r['shards']} | {r['wall']:.1f} | {speed:.2f} | "
            f"{speed / r['workers']:.0%} | {shards} |"
        )
    layers = rows[0]["layers"]
    costs = per_batch_costs(args.batch, layers, args.repeat)
    print(f"\nper-batch costs (batch {args.batch}, 1 thread, {layers} layers):")
    print(harness.table("step", costs, "wall"))
    harness.finish(args.json, {"runs": rows}, costs)


if __name__ == "__main__":
    main()
