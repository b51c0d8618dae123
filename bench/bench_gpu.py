"""The GPU path: imported 224-pixel timm models on CUDA in bf16 and fp32, and a cell's company.

The workload is the shard benchmark's pair (``mixer_s16_224``, ``resmlp_12_224``, random-init,
10 classes), each written by timm's ``save_for_hf``, zipped, and read back through
:mod:`models.hub` as a user's upload is (so each model reads the images through its own
pipeline, from its data config), with their default layers (26 in all), over an ImageFolder
zip of ``--images`` random photos of mixed sizes.

1. Time per 1000 images and peak GPU memory (``torch.cuda.max_memory_allocated``) of the
   atlas at batch ``--batch``, bf16 autocast and fp32: from the photos (decoded, resized and
   cropped per model on the CPU, as a comparison of an upload runs) and from images already
   decoded to 224 × 224 tensors (the GPU's own share). Best of ``--repeats`` after an untimed
   warm-up run of each, the four runs in turns (:func:`harness.interleaved`, the card
   synchronised around each), the peak memory that of each one's last run.
2. Agreement: every cell over the first ``--check`` photos on the GPU (fp32 and bf16)
   against the same cells computed on the CPU in fp32.
3. A cell's company (issue 24) where forwards are cheap: the plain atlas against image-level
   intervals with the whole-sample sensitivity (``interval="images", sensitivity=True``), over
   ``--company`` tensors in batches of 32 (``bench_company.py --timm``'s setting), and the
   whole-sample step alone. Then the deflated CKA of that run against the CPU's, with the
   features kept on the GPU, moved to the host once they outgrow the room allowed
   (``analysis.batch_statistics.kept.KEEP_SHARE``), and kept on the host from the start.

The machine line and ``--json PATH`` (every timed run) are :mod:`harness`'s.

    python bench/bench_gpu.py                  # on a machine with CUDA
"""

from __future__ import annotations

import argparse
import io
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import harness  # bench/harness.py, beside this script
import numpy as np
import torch
from torch import nn
from workloads import TIMM_PAIR, imported_pair, photos_zip, time_whole_sample_step

import analysis
import analysis.batch_statistics.kept

CUDA = "cuda:0"

whole_sample = time_whole_sample_step()


def timed(
    nets: dict[str, nn.Module], runs: dict[str, tuple[Any, dict[str, Any]]], repeats: int
) -> dict[str, harness.Timed]:
    """Each run (its data and compare's options) ``repeats`` times in turns after a warm-up
    each; a run's result is the peak GPU memory of it."""

    def job(data: Any, options: dict[str, Any]) -> Any:
        def peak() -> int:
            torch.cuda.reset_peak_memory_stats()
            analysis.compare(nets, data, device=CUDA, **options)
            return torch.cuda.max_memory_allocated()

        return peak

    jobs = {name: job(data, options) for name, (data, options) in runs.items()}
    return harness.interleaved(jobs, repeats, sync=torch.cuda.synchronize)


def cells(atlas: analysis.Atlas) -> np.ndarray:
    return np.concatenate([atlas.matrix(a, b).ravel() for a, b in atlas.pairs()])


def deflated(atlas: analysis.Atlas) -> np.ndarray:
    """Every cell's CKA with either side's whole-sample top direction removed."""
    return np.concatenate([np.ravel(atlas.without_top_pc(a, b)) for a, b in atlas.pairs()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--check", type=int, default=256)
    ap.add_argument("--company", type=int, default=256)
    harness.options(ap, repeat=2, clock=None, threads=None)
    args = harness.parse(ap)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA device; none is visible to torch.")
    device = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} CPU threads")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        root = Path(tmp)
        nets = imported_pair(root)
        (root / "photos.zip").write_bytes(photos_zip(args.images))
        photos = analysis.load_dataset(root / "photos.zip")
        tensors = torch.rand(args.images, 3, 224, 224, generator=torch.Generator().manual_seed(0))

        print(f"\n{', '.join(TIMM_PAIR)}: {args.images} images, batch {args.batch}")
        print("\n| input | dtype | s per 1000 images | peak GPU memory |\n|---|---|---|---|")
        runs = {
            f"{label} | {dtype}": (data, {"batch_size": args.batch, "dtype": dtype})
            for label, data in (("photos, decoded per model", photos), ("224 px tensors", tensors))
            for dtype in ("bf16", "fp32")
        }
        atlas = timed(nets, runs, args.repeat)
        for name, times in atlas.items():
            per_1000 = times.stat("wall", "min") / args.images * 1000
            print(f"| {name} | {per_1000:.2f} | {times.result / 2**30:.2f} GiB |")

        sample = root / "check.zip"
        with (
            zipfile.ZipFile(io.BytesIO(photos_zip(args.images))) as whole,
            zipfile.ZipFile(sample, "w") as part,
        ):
            for member in sorted(whole.namelist())[: args.check]:
                part.writestr(member, whole.read(member))
        check = analysis.load_dataset(sample)
        common = {"batch_size": min(args.batch, args.check)}
        cpu = cells(analysis.compare(nets, check, device="cpu", **common))
        print(f"\nagreement with the CPU in fp32 over {args.check} photos ({cpu.size} cells):")
        for dtype in ("fp32", "bf16"):
            gpu = cells(analysis.compare(nets, check, device=CUDA, dtype=dtype, **common))
            print(f"  GPU {dtype}: max |ΔCKA| {np.nanmax(np.abs(gpu - cpu)):.1e}")

        data = tensors[: args.company]
        print(f"\na cell's company on the GPU: {args.company} tensors, batches of 32")
        print("\n| run | seconds | × plain |\n|---|---|---|")
        whole_sample.clear()
        both_options = {"batch_size": 32, "interval": "images", "sensitivity": True}
        runs = {"plain atlas": (data, {"batch_size": 32}), "both": (data, both_options)}
        company = timed(nets, runs, args.repeat)
        plain = company["plain atlas"].stat("wall", "min")
        for name, times in company.items():
            best = times.stat("wall", "min")
            print(f"| {name} | {best:.2f} | {best / plain:.2f} |")
        print(f"\nthe whole-sample step alone (best): {min(whole_sample):.2f} s")

        sens: dict[str, Any] = {"batch_size": 32, "sensitivity": True}
        cpu = deflated(analysis.compare(nets, data, device="cpu", **sens))
        print(f"\ndeflated CKA against the CPU's ({cpu.size} values):")
        shares = {
            "kept on the GPU": analysis.batch_statistics.kept.KEEP_SHARE,
            "moved to the host during the run (1 % of free memory allowed)": 0.01,
            "kept on the host": 0.0,
        }
        moves: list[int] = []
        to_host = analysis.batch_statistics.kept.KeptFeatures._to_host

        def counted(kept: analysis.batch_statistics.kept.KeptFeatures) -> None:
            moves.append(sum(b is not None for b in kept.buffers))
            to_host(kept)

        analysis.batch_statistics.kept.KeptFeatures._to_host = counted  # type: ignore[method-assign,assignment]
        for where, share in shares.items():
            analysis.batch_statistics.kept.KEEP_SHARE = share
            moves.clear()
            gpu = deflated(analysis.compare(nets, data, device=CUDA, **sens))
            moved = f"{moves[0]} layers' buffers moved" if moves else "nothing moved"
            print(f"  {where}: max |Δ| {np.nanmax(np.abs(gpu - cpu)):.1e} ({moved})")
    harness.finish(
        args.json,
        {"images": args.images, "batch": args.batch, "whole_sample_s": whole_sample},
        {**atlas, **company},
    )


if __name__ == "__main__":
    main()
