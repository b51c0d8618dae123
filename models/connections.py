"""Structural measures of a model: Ω, effective width, parameter count and input spec.

Hayase & Karakida compare architectures at a matched number of *connections* Ω: read every
block as layers of one wide MLP on the flattened token table (width m = S·C) and average, over
these *effective layers*, the number of non-zero weights of each layer's m-wide weight matrix.

- Mixer / RP-Mixer: token mixing weights W (γt·S × S) act as I_C ⊗ W, i.e. C copies, so each
  has C·numel(W) = γt·C·S² non-zeros; channel weights (γc·C × C) act as W ⊗ I_S with
  γc·C²·S. Four effective layers per block give Ω = (γt·C·S² + γc·C²·S)/2.
- gMLP: W_in (S copies), the spatial gate's S × S matrix (one copy per gate channel, γ·C/2
  of them) and W_out (S copies): three effective layers per block.
- SW-MLP: the ones in each weight's mask (round(p·γ·m²)); dense MLP: γ·m².

Counts are structural (numel times copies, or mask ones), not ``count_nonzero`` of the current
values, so they are defined on the meta device and do not drift when a weight happens to be 0.
Which layers of a block are effective layers, and how many copies each has, is the family's
knowledge: each registered family (:mod:`models.families`) counts the blocks it knows. A layer
with a ``connection_count()`` method (the SW-MLP's masked linear) counts its own connections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from models.errors import ConfigError
from models.families import registered

__all__ = [
    "InputSpec",
    "connections",
    "effective_width",
    "input_spec",
    "linear_connections",
    "parameter_count",
]


@dataclass(frozen=True)
class InputSpec:
    """What a model consumes: images (channels, height, width), classes, and normalisation.

    Inputs are ``(x - mean) / std`` per channel of pixels in [0, 1]; the project's presets use
    the identity (mean 0, std 1).
    """

    channels: int
    height: int
    width: int
    num_classes: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.height, self.width)


def linear_connections(layer: Any) -> int:
    """Non-zero weights of one linear layer: its own count if it has one, else every weight."""
    count = getattr(layer, "connection_count", None)
    if callable(count):
        return int(count())
    if isinstance(layer, nn.Linear):
        return layer.weight.numel()
    raise ConfigError(f"cannot count connections of a {type(layer).__name__} layer")


def _block_layers(block: Any, tokens: int, channels: int) -> list[int]:
    """Non-zero weights of each effective layer of one block, as its family counts them."""
    for family in registered():
        counts = family.block_connections(block, tokens, channels)
        if counts is not None:
            return counts
    raise ConfigError(f"Ω is not defined for blocks of type {type(block).__name__}")


def _token_shape(model: Any) -> tuple[int, int]:
    stem = getattr(model, "stem", None)
    blocks = getattr(model, "blocks", None)
    if stem is None or blocks is None or not hasattr(stem, "num_patches"):
        raise ConfigError(
            f"{type(model).__name__} is not a Mixer-style model (stem, blocks): "
            "Ω and effective width are defined for Mixer, RP-Mixer, gMLP, SW-MLP and MLP"
        )
    return int(stem.num_patches), int(model.embed_dim)


def connections(model: Any) -> int:
    """Ω: the average number of non-zero weights per effective layer (rounded to an integer)."""
    tokens, channels = _token_shape(model)
    counts = [n for block in model.blocks for n in _block_layers(block, tokens, channels)]
    if not counts:
        raise ConfigError("a model without blocks has no connections to count")
    return round(sum(counts) / len(counts))


def effective_width(model: nn.Module) -> int:
    """m = S·C: the width of the MLP that a block acts on (the SW-MLP's vector width)."""
    tokens, channels = _token_shape(model)
    return tokens * channels


def parameter_count(model: nn.Module, *, free: bool = False) -> int:
    """Stored parameters; with ``free=True`` masked-out weights (the SW-MLP's) are not counted."""
    total = sum(p.numel() for p in model.parameters())
    if free:
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(weight, Tensor) and callable(getattr(module, "connection_count", None)):
                total -= weight.numel() - linear_connections(module)
    return total


def input_spec(model: nn.Module) -> InputSpec:
    """Input shape, classes and normalisation, from the model's stem and timm pretrained cfg."""
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    stem = getattr(model, "stem", None) or getattr(model, "patch_embed", None)
    img_size = getattr(stem, "img_size", None)
    channels = getattr(model, "in_chans", None)
    input_size = cfg.get("input_size")
    if img_size is None and input_size is not None:
        img_size = tuple(input_size[1:])
    if channels is None and input_size is not None:
        channels = input_size[0]
    if img_size is None or channels is None:
        raise ConfigError(f"cannot tell the input shape of a {type(model).__name__}")
    height, width = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    mean = tuple(float(v) for v in cfg.get("mean", ()))
    std = tuple(float(v) for v in cfg.get("std", ()))
    if len(mean) != channels or len(std) != channels:
        mean, std = (0.0,) * int(channels), (1.0,) * int(channels)
    num_classes = int(getattr(model, "num_classes", cfg.get("num_classes", 0)) or 0)
    return InputSpec(int(channels), int(height), int(width), num_classes, mean, std)
