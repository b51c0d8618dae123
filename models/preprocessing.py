"""A model's input pipeline: how an image file becomes the tensor the model was trained on.

A pipeline is a small JSON-able mapping in timm's data-config vocabulary, so that timm's
``create_transform`` builds it unchanged::

    {"input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.875,
     "crop_mode": "center", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}

timm architectures (and imported Hugging Face folders) take theirs from timm's
``resolve_data_config``; the project's presets, which see whole images in [0, 1] without
normalisation, get an exact-size, uncropped, identity-normalised pipeline from their sidecar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from timm.data import resolve_data_config
from torch import nn

from models.connections import input_spec
from models.errors import CheckpointError

__all__ = [
    "INTERPOLATIONS",
    "MAX_MEAN",
    "PIPELINE_KEYS",
    "STD_RANGE",
    "data_config",
    "pipeline_from_spec",
    "validate",
]

PIPELINE_KEYS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
CROP_MODES = ("center", "squash", "border")
# A pixel in [0, 1] becomes (x - mean) / std: with |mean| <= 1000 and std in [1e-3, 1e3] it
# stays within ±1e6, so an image's squared norm (4 × 8192² values at most) stays below 3e20,
# far inside float32, whatever the pipeline. Published pipelines use means in [0, 1] and stds
# near 0.25 (or 0-255 scales such as 123.7 and 58.4, inside these bounds too).
MAX_MEAN = 1000.0
STD_RANGE = (1e-3, 1e3)


def pipeline_from_spec(
    input_shape: list[int] | tuple[int, ...], mean: Any = None, std: Any = None
) -> dict[str, Any]:
    """The pipeline of a model that sees whole images of ``input_shape`` (no crop)."""
    channels = int(input_shape[0])
    return validate(
        {
            "input_size": [int(v) for v in input_shape],
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": list(mean) if mean else [0.0] * channels,
            "std": list(std) if std else [1.0] * channels,
        }
    )


def data_config(
    model: nn.Module, pretrained_cfg: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The pipeline of ``model``: timm's data config for timm models, the spec for presets.

    ``pretrained_cfg`` (a Hugging Face folder's, say) takes precedence over the model's own;
    a model loaded from a checkpoint carries the pipeline its sidecar recorded.
    """
    recorded = getattr(model, "atlas_preprocessing", None)
    if recorded is not None and pretrained_cfg is None:
        return validate(recorded)
    spec = input_spec(model)
    own = pipeline_from_spec(list(spec.shape), spec.mean, spec.std)
    atlas = getattr(model, "atlas_config", None) or {}
    if atlas.get("family", "timm") != "timm" and pretrained_cfg is None:
        return own
    cfg = resolve_data_config({}, pretrained_cfg=dict(pretrained_cfg or {}) or None, model=model)
    timm_cfg = {key: cfg[key] for key in PIPELINE_KEYS if key in cfg}
    if list(timm_cfg.get("input_size", ())) != own["input_size"]:
        # built with another in_chans/img_size than its published config describes
        return own
    return validate(timm_cfg)


def validate(value: Any, source: str = "the preprocessing") -> dict[str, Any]:
    """Check a pipeline mapping (from a sidecar or a config.json) and return it normalised."""
    if not isinstance(value, Mapping):
        raise CheckpointError(f"{source} must be a JSON object")
    try:
        size = [int(v) for v in value["input_size"]]
        mean = [float(v) for v in value["mean"]]
        std = [float(v) for v in value["std"]]
        interpolation = str(value.get("interpolation", "bilinear"))
        crop_pct = float(value.get("crop_pct") or 1.0)
        crop_mode = str(value.get("crop_mode") or "center")
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(
            f"{source} needs input_size [C, H, W], mean and std per channel"
        ) from None
    channels = size[0] if len(size) == 3 else 0
    if len(size) != 3 or not 1 <= channels <= 4 or not all(1 <= v <= 8192 for v in size[1:]):
        raise CheckpointError(f"{source} has an input_size {size} that is not [C<=4, H, W]")
    if len(mean) != channels or len(std) != channels:
        raise CheckpointError(f"{source} needs one mean and one std per channel ({channels})")
    _within(source, "mean", mean, -MAX_MEAN, MAX_MEAN)
    _within(source, "std", std, *STD_RANGE)
    if interpolation not in INTERPOLATIONS:
        raise CheckpointError(f"{source} has an unknown interpolation {interpolation!r}")
    if crop_mode not in CROP_MODES or not 0.05 <= crop_pct <= 1.0:
        raise CheckpointError(f"{source} has an invalid crop ({crop_mode}, {crop_pct})")
    return {
        "input_size": size,
        "interpolation": interpolation,
        "crop_pct": crop_pct,
        "crop_mode": crop_mode,
        "mean": mean,
        "std": std,
    }


def _within(source: str, key: str, values: list[float], low: float, high: float) -> None:
    """Refuse the first of ``values`` outside [low, high]: NaN and infinities too."""
    bad = next((v for v in values if not low <= v <= high), None)
    if bad is not None:
        raise CheckpointError(
            f"{source} has a {key} of {bad!r}; each channel's {key} must be a number from "
            f"{low:g} to {high:g}"
        )
