"""What the benchmarks share, built with the libraries only (no service stack).

The 224-pixel timm pair (``mixer_s16_224``, ``resmlp_12_224``, random-init, 10 classes) as
timm's ``save_for_hf`` writes it, and an ImageFolder of random photos of mixed sizes, each
zipped as a user would upload them; the pair read back as an upload is (:func:`imported_pair`);
the demo zoo's six models, trained or untrained (:func:`demo_models`), and the demo atlas they
make over digits (:class:`DemoAtlas`); and a timer on the sensitivity's whole-sample step.
"""

from __future__ import annotations

import argparse
import io
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from PIL import Image
from timm.models import save_for_hf
from torch import nn

import analysis
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


@dataclass(frozen=True)
class DemoAtlas:
    """The demo atlas of ``make run``: its six models (:func:`demo_models`) over digits' 450 test
    images (as the demo registers them) in batches of ``batch``, on the CPU. Calling it computes
    the atlas with the options given (default layers, linear unbiased minibatch CKA, the
    analytic null unless told otherwise)."""

    nets: dict[str, nn.Module]
    data: analysis.ImageDataset
    batch: int
    trained: bool

    @staticmethod
    def options(ap: argparse.ArgumentParser) -> None:
        """``--batch`` and ``--zoo``, the flags :meth:`load` takes."""
        ap.add_argument("--batch", type=int, default=150)
        ap.add_argument("--zoo", help="the trained demo zoo's directory (default: untrained)")

    @classmethod
    def load(cls, zoo: str | Path | None = None, batch: int = 150) -> DemoAtlas:
        """The trained zoo in ``zoo`` (what ``make run`` trains), else untrained models: the
        cost depends on the shapes, not the weights (but a tail check's draws do)."""
        data = analysis.load_dataset("digits")
        assert isinstance(data, analysis.ImageDataset)
        return cls(demo_models(zoo), data, batch, trained=bool(zoo))

    def __call__(self, **options: Any) -> analysis.Atlas:
        return analysis.compare(
            self.nets, self.data, batch_size=self.batch, device="cpu", **options
        )

    def describe(self) -> str:
        """ "6 untrained models, n=450, batch 150"."""
        kind = "trained" if self.trained else "untrained"
        return f"{len(self.nets)} {kind} models, n={len(self.data)}, batch {self.batch}"


def time_whole_sample_step() -> list[float]:
    """From now on, time every call of the sensitivity's whole-sample step
    (:func:`analysis.estimators.spectrum.whole_sample_sensitivity`, as
    :mod:`analysis.batch_statistics.sensitivity` calls it: a wrap for benchmarks only); each
    call's seconds are appended to the list returned."""
    from analysis.batch_statistics import sensitivity

    seconds: list[float] = []
    step = sensitivity.whole_sample_sensitivity

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return step(*args)
        finally:
            seconds.append(time.perf_counter() - start)

    sensitivity.whole_sample_sensitivity = timed  # type: ignore[assignment]
    return seconds
