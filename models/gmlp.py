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
from timm.models import MlpMixer
from timm.models.mlp_mixer import SpatialGatingBlock

from models._builder import COMMON_DEFAULTS, Presets, check_divisible
from models.connections import linear_connections
from models.families import Recipe, register_family
from models.grids import shape_solver
from models.schema import MAX_EXPANSION, CommonOptions, tokens, whole

__all__ = ["GMLP_DEFAULTS", "GMLP_PRESETS", "GmlpOptions"]  # timm adds the entrypoints

# The shared sizes (models._builder.DIGITS, CIFAR) with γ = 6, timm's gMLP expansion
# (gmlp_s16_224). digits: S = 16, C = 32, 4 blocks, Ω = 6·32·16·(96 + 16)/6 = 57344 whole;
# cifar: S = C = 64, 8 blocks, Ω = 6·64·64·256/6 = 2²⁰, the same as mixer_cifar.
GMLP_DEFAULTS: dict[str, Any] = {**COMMON_DEFAULTS, "mlp_ratio": 6.0}


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


GMLP_PRESETS = Presets("gmlp", GmlpOptions, MlpMixer, _kwargs, GMLP_DEFAULTS)
GMLP_PRESETS.register_with_timm(
    __name__,
    gmlp_digits="gMLP for 8×8 digits: S = 16, C = 32, γ = 6, 4 blocks.",
    gmlp_cifar="gMLP for 32×32 CIFAR images: S = C = 64, γ = 6, 8 blocks.",
)
register_family(
    GMLP_PRESETS.family(
        recipe=Recipe(epochs=30, lr=2e-3),
        check=_check,
        gamma=_gamma,
        block_connections=_block_connections,
        grid=shape_solver(_omega_coefficients),
        rank=3,
    )
)
