"""What the benchmarks share, built with the libraries only (no service stack).

The 224-pixel timm pair (``mixer_s16_224``, ``resmlp_12_224``, random-init, 10 classes) as
timm's ``save_for_hf`` writes it, and an ImageFolder of random photos of mixed sizes, each
zipped as a user would upload them; the pair read back as an upload is (:func:`imported_pair`);
the demo zoo's six models, trained or untrained (:func:`demo_models`); and a timer on the
sensitivity's whole-sample step.
"""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from PIL import Image
from timm.models import save_for_hf
from torch import nn

import analysis.shards.shard
import models
from models.hub import load_hub, read_hub
from models.training import ZOO

TIMM_PAIR = ("mixer_s16_224", "resmlp_12_224")


def photos_zip(n: int, seed: int = 0) -> bytes:
    """An ImageFolder zip of ``n`` random RGB photos of mixed sizes, in two classes."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(n):
            w, h = int(rng.integers(160, 320)), int(rng.integers(160, 320))
            pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=90)
            zf.writestr(f"photos/{'ab'[i % 2]}/{i:04d}.jpg", out.getvalue())
    return buf.getvalue()


def timm_model(name: str) -> nn.Module:
    """``name`` with random weights from seed 0 and 10 classes, in eval mode."""
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10).eval()


def hub_zip(name: str, root: Path) -> bytes:
    """A random-init ``name`` (:func:`timm_model`) written by timm's save_for_hf, zipped."""
    model = timm_model(name)
    folder = root / name
    save_for_hf(model, folder, safe_serialization=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(folder.rglob("*")):
            zf.write(p, f"{name}/{p.relative_to(folder).as_posix()}")
    return buf.getvalue()


def imported_pair(root: Path, names: tuple[str, ...] = TIMM_PAIR) -> dict[str, nn.Module]:
    """The pair (or ``names``) as an upload becomes it: zip → models.hub → a model with its own
    pipeline."""
    nets = {}
    for name in names:
        archive = root / f"{name}.zip"
        archive.write_bytes(hub_zip(name, root / "written"))
        scratch = root / f"scratch-{name}"
        scratch.mkdir()
        model, _ = load_hub(read_hub(archive, scratch))
        nets[name] = model.eval()
    return nets


def demo_models(zoo: str | Path | None = None) -> dict[str, nn.Module]:
    """The demo's six models (``models.training.ZOO``) in eval mode: loaded from the trained zoo
    in ``zoo`` (what ``make run`` trains), else untrained from their presets and seeds."""
    if zoo:
        return {name: models.load(Path(zoo) / name)[0].eval() for name, _, _ in ZOO}
    return {name: models.create(arch, seed=seed).eval() for name, arch, seed in ZOO}


def time_whole_sample_step() -> list[float]:
    """From now on, time every call of the sensitivity's whole-sample step
    (:func:`analysis.estimators.spectrum.whole_sample_sensitivity`, as :mod:`analysis.shards.shard`
    calls it: a wrap for benchmarks only); each call's seconds are appended to the list returned."""
    seconds: list[float] = []
    step = analysis.shards.shard.whole_sample_sensitivity

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return step(*args)
        finally:
            seconds.append(time.perf_counter() - start)

    analysis.shards.shard.whole_sample_sensitivity = timed  # type: ignore[assignment]
    return seconds
