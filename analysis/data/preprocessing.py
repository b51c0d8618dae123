"""Feeding each model through its own input pipeline.

A comparison reads one *raw* batch at a time — image files decoded as PIL images, or a
(b, C, H, W) tensor of an array's images — and every model turns the same raw batch into its
own input. Images go through timm's eval transform built from the model's pipeline (resize,
crop, to tensor, normalise) after conversion to the model's channel count; image files (an
:class:`ImageBatch`) get their 8-bit pixels after the crop decoded once per pipeline
(:mod:`analysis.data.decoded`) and only the last two steps per batch, with the same result to the
bit. Arrays are images
too: an array already of the model's input shape reaches it as it is (normalised by the
pipeline's mean and std, as pixels in [0, 1]: the presets' pipelines leave it unchanged); an
array of any other shape is mapped from its value range (:mod:`analysis.data.ranges`) to 8-bit
pixels and goes through the pipeline as decoded images do. Pipelines are the mappings of
:mod:`models.preprocessing` (``model.atlas_preprocessing`` once loaded).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch import nn

from analysis.data.ranges import ValueRange
from analysis.data.sources import BatchSource, ImageBatch
from analysis.errors import DatasetError

__all__ = ["ModelInput", "input_record", "model_input", "pipeline_key"]

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_ARRAY_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}  # an array's channels as an image
RawBatch = torch.Tensor | Sequence[Image.Image]


def pipeline_key(pipeline: Mapping[str, Any] | None) -> str:
    """A short stable identity of a pipeline ("raw" for none), for the Gram store's keys."""
    if pipeline is None:
        return "raw"
    text = json.dumps(dict(pipeline), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ModelInput:
    """One model's pipeline, applied to raw batches (see the module docstring).

    ``value_range``: the values of the arrays this model reads that stand for black and white,
    where they must be resized for it (None: arrays of another shape are refused).
    """

    def __init__(
        self, pipeline: Mapping[str, Any] | None, value_range: ValueRange | None = None
    ) -> None:
        self.pipeline = dict(pipeline) if pipeline is not None else None
        self.value_range = value_range if pipeline is not None else None
        self.key = pipeline_key(pipeline)
        if self.value_range is not None:  # resized arrays: their range makes the pixels
            self.key += f"|range:{self.value_range.low!r},{self.value_range.high!r}"
        self._transform: Any = None
        self._pil: Any = None  # the transform's steps on the PIL image (resize, crop)
        self._tensor: Any = None  # and those after its to-tensor (normalise)
        self.pixel_key = self.key
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
            self._pil, self._tensor = _split(self._transform)
            # what the decoded pixels depend on: the pipeline less its normalisation, so that
            # models differing only in mean and std share them
            steps = {k: v for k, v in cfg.items() if k not in ("mean", "std")}
            self.pixel_key = pipeline_key(steps)
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

    def pixels(self, image: Image.Image) -> np.ndarray:
        """One image's uint8 (C, H, W) pixels after the pipeline's resize and crop: what
        :mod:`analysis.data.decoded` keeps of it."""
        if self._pil is None:
            raise DatasetError("image files need a model with an input pipeline")
        if image.mode == "P":
            image = image.convert("RGBA")
        if image.mode != self.mode:
            image = image.convert(self.mode)
        hwc = np.asarray(self._pil(image), dtype=np.uint8)
        return (hwc[:, :, None] if hwc.ndim == 2 else hwc).transpose(2, 0, 1)

    def from_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """A uint8 (b, C, H, W) batch of :meth:`pixels` as this model's input: the pipeline's
        to-tensor (÷ 255 in float32) and normalisation, the same numbers as :meth:`image`."""
        assert self._tensor is not None
        out: torch.Tensor = self._tensor(pixels.to(torch.float32).div(255))
        return out

    def __call__(self, raw: RawBatch) -> torch.Tensor:
        if isinstance(raw, ImageBatch) and self._pil is not None:
            return self.from_pixels(raw.pixels(self.pixel_key, self.shape, self.pixels))
        if not isinstance(raw, torch.Tensor):
            return torch.stack([self.image(im) for im in raw])
        if self.pipeline is None:
            return raw
        if tuple(raw.shape[1:]) != self.shape:
            return torch.stack([self.image(im) for im in self.pictures(raw)])
        if self.identity:
            return raw
        return (raw - self.mean.to(raw)) / self.std.to(raw)

    def pictures(self, raw: torch.Tensor) -> list[Image.Image]:
        """A batch of an array's images as 8-bit images, mapped from the value range."""
        if self.value_range is None:
            raise DatasetError(
                f"the batches hold images of shape {tuple(raw.shape[1:])} but the model takes "
                f"{self.shape}; give an array, a dataset or an image folder (whose images "
                "each model's pipeline resizes), or batches of the model's shape"
            )
        channels = int(raw.shape[1])
        if channels not in _ARRAY_MODES:
            raise DatasetError(f"images of {channels} channels cannot be read as pictures")
        low, high = self.value_range.low, self.value_range.high
        scaled = (raw.detach().to("cpu", torch.float32) - low) / (high - low)
        data = scaled.clamp(0, 1).mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        mode = _ARRAY_MODES[channels]
        return [Image.fromarray(im[..., 0] if channels == 1 else im, mode) for im in data]


def _split(transform: Any) -> tuple[Any, Any]:
    """A timm eval transform as (its steps on the image, its steps after to-tensor), or
    (None, None) when it is not a composition with one to-tensor step."""
    steps = list(getattr(transform, "transforms", ()))
    cut = [i for i, t in enumerate(steps) if type(t).__name__ in ("ToTensor", "MaybeToTensor")]
    if len(cut) != 1:
        return None, None
    return _Steps(steps[: cut[0]]), _Steps(steps[cut[0] + 1 :])


class _Steps:
    """Some steps of a transform, applied in turn."""

    def __init__(self, steps: Sequence[Any]) -> None:
        self.steps = list(steps)

    def __call__(self, value: Any) -> Any:
        for step in self.steps:
            value = step(value)
        return value


def model_input(model: nn.Module, source: BatchSource | None = None) -> ModelInput:
    """The input of ``model`` for the batches of ``source``: the pipeline :func:`models.load`
    attached to it, else (for image files, and arrays of another shape than the model's, which
    need one) its timm data config; raw tensors otherwise. Arrays that the pipeline resizes get
    their value range (:meth:`BatchSource.pixel_range`)."""
    pipeline = getattr(model, "atlas_preprocessing", None)
    files = source is not None and source.kind == "files"
    shape = None if source is None else source.image_shape
    if pipeline is None and (files or shape is not None):
        from models.errors import ConfigError
        from models.preprocessing import data_config  # models is the lower library

        try:
            pipeline = data_config(model)
        except ConfigError:
            if files:
                raise
            pipeline = None  # a network of unknown input: the arrays reach it as they are
    resized = (
        pipeline is not None
        and shape is not None
        and list(shape) != [int(v) for v in pipeline["input_size"]]
    )
    return ModelInput(pipeline, source.pixel_range() if resized and source else None)


def input_record(source: BatchSource, inputs: Mapping[str, ModelInput]) -> dict[str, Any]:
    """What each model read, as a comparison records it (``config["input"]``): the images'
    kind (``files``, ``array``, ``batches``), the models whose pipelines resized an array (with
    the array's image shape and value range) or read the files, and the models that read the
    images as they are."""
    record: dict[str, Any] = {"images": source.kind}
    resized = sorted(m for m, i in inputs.items() if i.value_range is not None)
    if source.kind == "files":
        record["pipeline"] = sorted(inputs)
    elif resized:
        found = inputs[resized[0]].value_range
        assert found is not None
        record |= {"shape": list(source.image_shape or ()), "value_range": found.as_dict()}
        record["pipeline"] = resized
    record["as_is"] = sorted(set(inputs) - set(record.get("pipeline", ())))
    return record
