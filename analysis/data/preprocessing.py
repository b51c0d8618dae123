"""Feeding each model through its own input pipeline.

A comparison reads one *raw* batch at a time — image files decoded as PIL images, or a
(b, C, H, W) tensor of pixels in [0, 1] — and every model turns the same raw batch into its
own input: images go through timm's eval transform built from the model's pipeline (resize,
crop, to tensor, normalise) after conversion to the model's channel count; tensors must have
the model's input shape and are normalised. Pipelines are the mappings of
:mod:`models.preprocessing` (``model.atlas_preprocessing`` once loaded).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from PIL import Image
from timm.data import create_transform
from torch import nn

from analysis.errors import DatasetError

__all__ = ["ModelInput", "model_input", "pipeline_key"]

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
RawBatch = torch.Tensor | Sequence[Image.Image]


def pipeline_key(pipeline: Mapping[str, Any] | None) -> str:
    """A short stable identity of a pipeline ("raw" for none), for the Gram store's keys."""
    if pipeline is None:
        return "raw"
    text = json.dumps(dict(pipeline), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ModelInput:
    """One model's pipeline, applied to raw batches (see the module docstring)."""

    def __init__(self, pipeline: Mapping[str, Any] | None) -> None:
        self.pipeline = dict(pipeline) if pipeline is not None else None
        self.key = pipeline_key(pipeline)
        self._transform: Any = None
        if self.pipeline is not None:
            cfg = self.pipeline
            c, h, w = (int(v) for v in cfg["input_size"])
            self.shape: tuple[int, int, int] = (c, h, w)
            self.mode = _MODES.get(self.shape[0], "RGB")
            self._transform = create_transform(
                input_size=self.shape,
                interpolation=cfg["interpolation"],
                crop_pct=cfg["crop_pct"],
                crop_mode=cfg["crop_mode"],
                mean=tuple(cfg["mean"]),
                std=tuple(cfg["std"]),
                is_training=False,
            )
            self.mean = torch.tensor(cfg["mean"]).view(1, -1, 1, 1)
            self.std = torch.tensor(cfg["std"]).view(1, -1, 1, 1)
            self.identity = bool((self.mean == 0).all() and (self.std == 1).all())

    def image(self, image: Image.Image) -> torch.Tensor:
        """One image as this model's (C, H, W) input tensor."""
        if self._transform is None:
            raise DatasetError("image files need a model with an input pipeline")
        if image.mode == "P":  # through RGBA, so that palette transparency does not warn
            image = image.convert("RGBA")
        if image.mode != self.mode:
            image = image.convert(self.mode)
        out: torch.Tensor = self._transform(image)
        return out

    def __call__(self, raw: RawBatch) -> torch.Tensor:
        if not isinstance(raw, torch.Tensor):
            return torch.stack([self.image(im) for im in raw])
        if self.pipeline is None:
            return raw
        if tuple(raw.shape[1:]) != self.shape:
            raise DatasetError(
                f"the dataset's images are {tuple(raw.shape[1:])} but the model takes "
                f"{self.shape}; use an image folder, which each model's pipeline resizes"
            )
        if self.identity:
            return raw
        return (raw - self.mean.to(raw)) / self.std.to(raw)


def model_input(model: nn.Module, files: bool = False) -> ModelInput:
    """The input of ``model``: the pipeline :func:`models.load` attached to it, else (for
    image files, which need one) its timm data config; raw tensors otherwise."""
    pipeline = getattr(model, "atlas_preprocessing", None)
    if pipeline is None and files:
        from models.preprocessing import data_config  # models is the lower library

        pipeline = data_config(model)
    return ModelInput(pipeline)
