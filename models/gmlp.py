"""gMLP (Liu et al. 2021) built on timm's MlpMixer with ``SpatialGatingBlock``: options, presets, Ω.

A gMLP block is x + W_out · SGU(GELU(W_in · LN(x))) on the (B, S, C) token table: W_in expands
C to γ·C channels, the spatial gating unit splits them into halves u and v and returns
u ⊙ (W_s · LN(v) + b) with W_s an S × S token-mixing matrix, and W_out maps γ·C/2 back to C.
timm initialises W_s near 0 (std 1e-6) and b = 1, so every block starts as a plain channel
MLP, as the paper prescribes; we keep timm's initialisation untouched.

For Ω (:func:`models.connections`) a gMLP block has three effective layers on width m = S·C:
W_in (γ·C²·S non-zeros), W_s acting on the γ·C/2 gate channels (γ·C·S²/2) and W_out
(γ·C²·S/2); Ω is their average, γ·C·S·(3C + S)/6. The fixed-Ω grid solves that for C at
each patching. Options, checks, Ω, grid and recipe are registered once at the bottom.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field
from timm.layers.mlp import GatedMlp
from timm.models import MlpMixer, generate_default_cfgs, register_model
from timm.models.mlp_mixer import SpatialGatingBlock
from torch import nn

from models._builder import build_preset, check_divisible, default_cfg
from models.connections import linear_connections
from models.families import Family, Recipe, register_family
from models.grids import shape_solver
from models.schema import MAX_EXPANSION, CommonOptions, tokens, whole

__all__ = ["GMLP_DEFAULTS", "GmlpOptions", "gmlp_cifar", "gmlp_digits"]

GMLP_DEFAULTS: dict[str, Any] = {
    "img_size": 8,
    "in_chans": 1,
    "num_classes": 10,
    "patch_size": 2,
    "embed_dim": 32,
    "num_blocks": 4,
    "mlp_ratio": 6.0,
    "drop_rate": 0.0,
    "proj_drop_rate": 0.0,
    "drop_path_rate": 0.0,
    "seed": 0,
}

# digits: the Mixer's S = 16 tokens (2×2 patches of 8×8) and C = 32 channels, 4 blocks;
# γ = 6 is timm's gMLP expansion (gmlp_s16_224) and makes Ω = 6·32·16·(96 + 16)/6 = 57344 whole.
DIGITS = {"img_size": 8, "in_chans": 1, "patch_size": 2, "embed_dim": 32, "num_blocks": 4}
# cifar: S = C = 64 (4×4 patches of 32×32×3) like the other cifar presets, γ = 6, 8 blocks;
# Ω = 6·64·64·256/6 = 2²⁰, the same as mixer_cifar.
CIFAR = {"img_size": 32, "in_chans": 3, "patch_size": 4, "embed_dim": 64, "num_blocks": 8}


class GmlpOptions(CommonOptions):
    """gMLP: one expansion γ of C, split in half by the spatial gate."""

    mlp_ratio: float = Field(
        gt=0.0, le=MAX_EXPANSION, description="γ: hidden width over C; γ·C must be even"
    )


def _check(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """The patches tile the image and γ·C splits evenly into the gate's halves."""
    tokens(variant, config)
    whole(variant, "mlp_ratio", config["mlp_ratio"] * config["embed_dim"], "γ·C", even=True)
    return config


def _gamma(config: Mapping[str, Any], s: int, c: int) -> float:
    return float(config["mlp_ratio"])


def _block_connections(block: Any, s: int, c: int) -> list[int] | None:
    """W_in and W_out (S copies each) and the gate's S × S matrix (one per gate channel)."""
    if not isinstance(block, SpatialGatingBlock):
        return None
    mlp: Any = block.mlp_channels
    gate_channels = mlp.fc2.in_features
    return [
        s * linear_connections(mlp.fc1),
        gate_channels * linear_connections(mlp.gate.proj),
        s * linear_connections(mlp.fc2),
    ]


def _omega_coefficients(config: Mapping[str, Any]) -> tuple[float, float]:
    """(a, b) with Ω = γ·C·S·(3C + S)/6 = a·C² + b·C at the config's S and γ."""
    s = (config["img_size"] // config["patch_size"]) ** 2
    g = float(config["mlp_ratio"])
    return g * s / 2.0, g * s * s / 6.0


def _kwargs(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    check_divisible(variant, config["img_size"], config["patch_size"])
    return {
        **{k: v for k, v in config.items() if k != "seed"},
        "block_layer": SpatialGatingBlock,
        "mlp_layer": GatedMlp,
    }


def _create(variant: str, preset: dict[str, Any], pretrained: bool, **kwargs: Any) -> nn.Module:
    return build_preset(
        variant,
        "gmlp",
        MlpMixer,
        {**GMLP_DEFAULTS, **preset},
        kwargs,
        lambda config: _kwargs(variant, config),
        pretrained=pretrained,
    )


default_cfgs = generate_default_cfgs(
    {
        "gmlp_digits": default_cfg((1, 8, 8)),
        "gmlp_cifar": default_cfg((3, 32, 32)),
    }
)


@register_model
def gmlp_digits(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """gMLP for 8×8 digits: S = 16, C = 32, γ = 6, 4 blocks."""
    return _create("gmlp_digits", DIGITS, pretrained, **kwargs)


@register_model
def gmlp_cifar(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """gMLP for 32×32 CIFAR images: S = C = 64, γ = 6, 8 blocks."""
    return _create("gmlp_cifar", CIFAR, pretrained, **kwargs)


register_family(
    Family(
        name="gmlp",
        options=GmlpOptions,
        presets={
            "gmlp_digits": {**GMLP_DEFAULTS, **DIGITS},
            "gmlp_cifar": {**GMLP_DEFAULTS, **CIFAR},
        },
        recipe=Recipe(epochs=30, lr=2e-3),
        check=_check,
        gamma=_gamma,
        block_connections=_block_connections,
        grid=shape_solver(_omega_coefficients),
        rank=3,
    )
)
