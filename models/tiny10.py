"""Tiny-10 (Kornblith et al. 2019): a plain stack of convolutions, with no residual stream.

Kornblith et al.'s layer-identification test (*Similarity of Neural Network Representations
Revisited*, Table 2) trained ten seeds of Tiny-10, a CIFAR-10 CNN in which every layer replaces
the representation instead of adding to it::

    3×3 conv w      -BN-ReLU  ×2
    3×3 conv 2w, stride 2 -BN-ReLU
    3×3 conv 2w     -BN-ReLU  ×2
    3×3 conv 4w, stride 2 -BN-ReLU
    3×3 conv 4w, valid padding -BN-ReLU
    1×1 conv 4w     -BN-ReLU
    global average pooling, logits          (w = 16: 16, 32 and 64 channels)

Here the first conv-BN-ReLU is the ``stem`` and the other seven are ``blocks.0``–``blocks.6``
(so the default layers of :func:`analysis.layers.default_layers` are the eight conv outputs and
the pooled ``pre_logits``); ``head`` is the logits. ``tiny10_cifar`` is the paper's network on
32×32×3 images (32 → 16 → 8 → 6 pixels). ``tiny10_digits`` takes 8×8 digits: after the two
stride-2 steps (8 → 4 → 2) a 3×3 valid conv has nothing left to slide over, so the digits
preset pads that conv (``valid_padding: 0``) and keeps the rest as the paper has it. Its layers
have 1,024 (8×8×16), 512 (4×4×32) and 256 (2×2×64) features, the pre-logits 64.

The family has no tokens or channels of a Mixer, so S, C, Ω and the effective width of
:func:`models.structure` are None. It is registered once at the bottom (options, presets and
their timm entrypoints, recipe).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from timm.models import generate_default_cfgs, register_model
from torch import nn

from models._builder import build_preset, default_cfg
from models.errors import ConfigError
from models.families import Family, Recipe, register_family
from models.schema import MAX_CLASSES, MAX_IMG_SIZE

__all__ = ["TINY10_PRESETS", "ConvBnRelu", "Tiny10", "Tiny10Options", "tiny10_layers"]

# Channels of the widest layers: 4w ≤ 4096 keeps any option a model that fits a machine.
MAX_WIDTH = 1024


class Tiny10Options(BaseModel):
    """Tiny-10's options: the input, the base width w and the padding of its one valid conv."""

    model_config = ConfigDict(extra="forbid", strict=True)

    img_size: int = Field(
        ge=1, le=MAX_IMG_SIZE, description="side of the square input image, in pixels"
    )
    in_chans: int = Field(ge=1, le=4, description="channels of the input image")
    num_classes: int = Field(ge=1, le=MAX_CLASSES, description="classes of the classifier head")
    width: int = Field(
        ge=1, le=MAX_WIDTH, description="w: channels of the first convs (then 2w, then 4w)"
    )
    valid_padding: int = Field(
        ge=0,
        le=1,
        description="1: the seventh conv is unpadded (valid), as in the paper; 0: padded",
    )
    drop_rate: float = Field(ge=0.0, lt=1.0, description="dropout before the head")
    seed: int = Field(ge=0, le=2**63 - 1, description="seed of the initial weights")


def tiny10_layers(
    in_chans: int, width: int, valid_padding: int
) -> list[tuple[int, int, int, int, int]]:
    """(in channels, out channels, kernel, stride, padding) of the eight convs, in order."""
    w, valid = width, bool(valid_padding)
    return [
        (in_chans, w, 3, 1, 1),
        (w, w, 3, 1, 1),
        (w, 2 * w, 3, 2, 1),
        (2 * w, 2 * w, 3, 1, 1),
        (2 * w, 2 * w, 3, 1, 1),
        (2 * w, 4 * w, 3, 2, 1),
        (4 * w, 4 * w, 3, 1, 0 if valid else 1),
        (4 * w, 4 * w, 1, 1, 0),
    ]


def _side(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _last_side(img_size: int, valid_padding: int) -> int:
    """Side of the last conv's output for a square image of ``img_size`` pixels (< 1: none)."""
    side = img_size
    for _, _, kernel, stride, padding in tiny10_layers(1, 1, valid_padding):
        side = (side + 2 * padding - kernel) // stride + 1
        if side < 1:
            return 0
    return side


def _check(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """The image must leave at least one pixel after every conv."""
    valid = config["valid_padding"]
    if _last_side(config["img_size"], valid) < 1:
        least = next(n for n in range(1, MAX_IMG_SIZE) if _last_side(n, valid) >= 1)
        raise ConfigError(
            f"option 'img_size' of {variant}: {config['img_size']} pixels vanish before the "
            f"last conv; with valid_padding {valid} use {least} or more"
        )
    return config


class ConvBnRelu(nn.Sequential):
    """One Tiny-10 layer: a bias-free conv, batch norm, ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=False),
        )


class Tiny10(nn.Module):
    """The stem (first conv), seven more conv layers as ``blocks``, pooling and the logits."""

    def __init__(
        self,
        img_size: int,
        in_chans: int,
        num_classes: int,
        width: int,
        valid_padding: int,
        drop_rate: float,
        **timm_kwargs: Any,
    ) -> None:
        super().__init__()
        device = timm_kwargs.pop("device", None)
        self.img_size, self.in_chans, self.num_classes = img_size, in_chans, num_classes
        first, *rest = tiny10_layers(in_chans, width, valid_padding)
        self.stem = ConvBnRelu(*first)
        self.blocks = nn.Sequential(*[ConvBnRelu(*layer) for layer in rest])
        self.num_features = rest[-1][1]
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes)
        if device is not None:
            self.to(device)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last conv layer's output, (B, 4w, H', W')."""
        features: torch.Tensor = self.blocks(self.stem(x))
        return features

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Global average pooling, then (unless ``pre_logits``) dropout and the logits."""
        pooled = x.mean(dim=(2, 3))
        if pre_logits:
            return pooled
        logits: torch.Tensor = self.head(self.head_drop(pooled))
        return logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


TINY10_DEFAULTS: dict[str, Any] = {
    "num_classes": 10,
    "width": 16,
    "drop_rate": 0.0,
    "seed": 0,
}
TINY10_PRESETS: dict[str, dict[str, Any]] = {
    "tiny10_digits": {**TINY10_DEFAULTS, "img_size": 8, "in_chans": 1, "valid_padding": 0},
    "tiny10_cifar": {**TINY10_DEFAULTS, "img_size": 32, "in_chans": 3, "valid_padding": 1},
}


def _cfg(config: dict[str, Any]) -> dict[str, Any]:
    size = (config["in_chans"], config["img_size"], config["img_size"])
    return {**default_cfg(size, config["num_classes"]), "first_conv": "stem.0"}


default_cfgs = generate_default_cfgs({name: _cfg(c) for name, c in TINY10_PRESETS.items()})


def _build(variant: str, pretrained: bool, kwargs: dict[str, Any]) -> nn.Module:
    def translate(config: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in config.items() if k != "seed"}

    return build_preset(
        variant, "tiny10", Tiny10, TINY10_PRESETS[variant], kwargs, translate, pretrained=pretrained
    )


@register_model
def tiny10_digits(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Tiny-10 for 8×8 digits: 16, 32, 64 channels, two stride-2 steps, the 7th conv padded."""
    return _build("tiny10_digits", pretrained, kwargs)


@register_model
def tiny10_cifar(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Tiny-10 for 32×32 CIFAR images, as Kornblith et al. 2019 built it (valid 7th conv)."""
    return _build("tiny10_cifar", pretrained, kwargs)


# The recipe reached 98.2 % test accuracy on digits at seed 0 (docs/architectures.md).
TINY10_FAMILY = register_family(
    Family(
        name="tiny10",
        options=Tiny10Options,
        presets=TINY10_PRESETS,
        recipe=Recipe(epochs=15, lr=3e-3),
        check=_check,
        rank=5,
    )
)
