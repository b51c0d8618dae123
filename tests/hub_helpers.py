"""Builders for the real-checkpoint tests: timm model folders and a folder of mixed images."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.models import save_for_hf

HUB_MODELS = {"mixer_s16_224": 8, "resmlp_12_224": 12}  # name -> blocks
N_IMAGES = 48


def zip_dir(folder: Path, out: Path) -> Path:
    """``out``: a zip holding ``folder`` under its own name, as people zip folders."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, f"{folder.name}/{p.relative_to(folder).as_posix()}")
    return out


def hub_folder(name: str, root: Path, seed: int = 0) -> tuple[torch.nn.Module, Path]:
    """Random-init ``name`` (10 classes) written by timm's own save_for_hf (safetensors)."""
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=10).eval()
    folder = root / name
    save_for_hf(model, folder, safe_serialization=True)
    return model, folder


def mixed_images(root: Path, n: int = N_IMAGES) -> Path:
    """An ImageFolder of ``n`` images in two classes: sizes, modes and formats all mixed.

    The first image by path (``a/000.png``) is a 37×53 grayscale PNG.
    """
    rng = np.random.default_rng(0)
    kinds = [("L", "png"), ("RGB", "jpg"), ("RGBA", "png"), ("P", "png"), ("RGB", "webp")]
    folder = root / "photos"
    for i in range(n):
        mode, ext = kinds[i % len(kinds)]
        w, h = (53, 37) if i == 0 else (int(rng.integers(20, 300)), int(rng.integers(20, 300)))
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        image = Image.fromarray(pixels, "RGB")
        image = image.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else image
        image = image.convert(mode) if mode != "P" else image
        path = folder / ("a" if i % 2 == 0 else "b") / f"{i:03d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
    return folder


def timm_input(name: str, image_path: Path) -> torch.Tensor:
    """What timm itself feeds ``name``: its eval transform of the image as RGB."""
    model = timm.create_model(name, pretrained=False, num_classes=10)
    transform = create_transform(**resolve_data_config({}, model=model))
    with Image.open(image_path) as image:
        out: torch.Tensor = transform(image.convert("RGB"))
    return out


class StemRecorder:
    """Keeps the first input a model's stem receives (the tensor the model saw)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.first: torch.Tensor | None = None
        self.handle = model.stem.register_forward_pre_hook(self._keep)  # type: ignore[union-attr]

    def _keep(self, _module: object, args: tuple[torch.Tensor, ...]) -> None:
        if self.first is None:
            self.first = args[0][0].detach().cpu().clone()

    def close(self) -> None:
        self.handle.remove()
