"""The atlas over photos against the same images as tensors: cold cache, warm cache, no cache.

A comparison of image files decodes, resizes and crops them once per distinct pipeline into a
decoded-image cache (:mod:`analysis.data.decoded`) and reads that cache the next time; this
measures what that costs against the atlas over the same images already decoded. One pair of
models (default the imported timm pair, :data:`workloads.TIMM_PAIR`), ``--images`` random JPEG
photos of mixed sizes (:func:`workloads.photos_zip`), batch ``--batch``, four jobs interleaved
after a warm-up (:mod:`harness`):

- ``tensors``: the same photos through the first model's resize and crop, as a float tensor in
  [0, 1] of the models' input shape (each model normalises it);
- ``photos, warm``: the files, with a cache filled beforehand (decodes nothing);
- ``photos, cold``: the files, with an empty cache each run (decodes every file once per
  pipeline, on the decoding pool, and writes the cache);
- ``photos, no cache``: the files without a cache (each batch decoded as it is read);
- ``photos, cold, GPU JPEG`` (on CUDA only): cold, the JPEG files decoded by the card
  (:mod:`analysis.data.gpu_jpeg`): whether that is faster than the host's pool.

Ratios are to ``tensors``; the targets (issue 46) are warm ≤ 1.1 and, on a 16-core GPU host,
cold ≤ 2. :func:`photos_vs_tensors` is also the ``photos`` section of ``bench_gpu_host.py``.

    PYTHONPATH=. python bench/photos_atlas.py --images 128 --batch 32 --threads 2
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ beside it, run from anywhere
import harness
from workloads import TIMM_PAIR, imported_pair, photos_zip

import analysis
from analysis.data.preprocessing import model_input
from analysis.data.sources import batch_source


def photo_dataset(n: int, root: Path) -> Any:
    """``n`` random JPEG photos of mixed sizes, loaded as an upload is (an ImageFiles)."""
    archive = root / "photos.zip"
    archive.write_bytes(photos_zip(n))
    return analysis.load_dataset(str(archive))


def as_tensors(nets: Mapping[str, nn.Module], photos: Any) -> torch.Tensor:
    """The photos through the first model's resize and crop, as float32 in [0, 1]."""
    made = model_input(next(iter(nets.values())), batch_source(photos, 1, None, files=True))
    pixels = np.stack([made.pixels(photos.image(i)) for i in range(len(photos))])
    return torch.from_numpy(pixels).float().div(255)


def photos_vs_tensors(
    nets: Mapping[str, nn.Module],
    images: int,
    batch: int,
    repeats: int,
    device: torch.device,
    sync: Callable[[], None] = lambda: None,
    dtype: str | None = None,
) -> tuple[dict[str, Any], dict[str, harness.Timed]]:
    """The four jobs of the module docstring, timed: (figures, timings)."""
    options: dict[str, Any] = {"batch_size": batch, "device": device, "dtype": dtype}
    with tempfile.TemporaryDirectory(prefix="bench-photos-") as tmp:
        root = Path(tmp)
        photos = photo_dataset(images, root)
        tensors = as_tensors(nets, photos)
        warm = analysis.DirectoryDecodedCache(root / "warm")
        analysis.compare(nets, photos, decoded_cache=warm, **options)  # fills it
        fresh = itertools.count()

        def cold(gpu_jpeg: bool = False) -> analysis.Atlas:
            empty = analysis.DirectoryDecodedCache(root / f"cold-{next(fresh)}")
            return analysis.compare(nets, photos, decoded_cache=empty, gpu_jpeg=gpu_jpeg, **options)

        jobs = {
            "tensors": lambda: analysis.compare(nets, tensors, **options),
            "photos, warm": lambda: analysis.compare(nets, photos, decoded_cache=warm, **options),
            "photos, cold": cold,
            "photos, no cache": lambda: analysis.compare(nets, photos, **options),
        }
        if device.type == "cuda":  # the card decodes the JPEG files (nvJPEG), the host resizes
            jobs["photos, cold, GPU JPEG"] = lambda: cold(gpu_jpeg=True)
        timed = harness.interleaved(jobs, repeats, sync=sync)
    base = timed["tensors"].stat("wall")
    rows = [
        {
            "job": name,
            "s_per_1000": timed[name].stat("wall") / images * 1000,
            "ratio": timed[name].stat("wall") / base,
        }
        for name in timed
    ]
    figures = {
        "pair": list(nets),
        "images": images,
        "batch": batch,
        "repeats": repeats,
        "dtype": dtype or "fp32",
        "decode_threads": torch.get_num_threads(),
        "rows": rows,
    }
    return figures, timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, default=list(TIMM_PAIR), help="two timm models")
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    harness.options(ap, repeat=3, clock=None)
    args = harness.parse(ap)
    with tempfile.TemporaryDirectory(prefix="bench-photos-pair-") as tmp:
        nets = imported_pair(Path(tmp), tuple(args.pair))
    figures, timed = photos_vs_tensors(
        nets, args.images, args.batch, args.repeat, torch.device("cpu")
    )
    title = f"{' + '.join(args.pair)}, {args.images} photos, batch {args.batch}"
    print(harness.table(title, timed, "wall", base="tensors"))
    harness.finish(args.json, figures, timed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def table_lines(figures: dict[str, Any]) -> list[str]:
    """The figures as markdown lines (``bench_gpu_host.py``'s ``photos`` section)."""
    if "rows" not in figures:
        return []
    head = f"## Atlas over photos vs the same images as tensors: {', '.join(figures['pair'])}, "
    head += f"{figures['images']} photos, batch {figures['batch']}, {figures['dtype']}"
    lines = ["", head, "", "| input | s/1000 img | ratio to tensors |", "|---|---:|---:|"]
    for r in figures["rows"]:
        lines.append(f"| {r['job']} | {r['s_per_1000']:.3f} | {r['ratio']:.2f} |")
    return lines
