"""gMLP presets (Liu et al. 2021) built on timm's MlpMixer with ``SpatialGatingBlock``.

A gMLP block is x + W_out · SGU(GELU(W_in · LN(x))) on the (B, S, C) token table: W_in expands
C to γ·C channels, the spatial gating unit splits them into halves u and v and returns
u ⊙ (W_s · LN(v) + b) with W_s an S × S token-mixing matrix, and W_out maps γ·C/2 back to C.
timm initialises W_s near 0 (std 1e-6) and b = 1, so every block starts as a plain channel
MLP, as the paper prescribes; we keep timm's initialisation untouched.

For Ω (:func:`models.connections`) a gMLP block has three effective layers on width m = S·C:
W_in (γ·C²·S non-zeros), W_s acting on the γ·C/2 gate channels (γ·C·S²/2) and W_out
(γ·C²·S/2); Ω is their average, γ·C·S·(3C + S)/6.
"""

from __future__ import annotations

from typing import Any

from timm.layers import GatedMlp
from timm.models import MlpMixer, generate_default_cfgs, register_model
from timm.models.mlp_mixer import SpatialGatingBlock
from torch import nn

from models._builder import build_preset, check_divisible, default_cfg, register

__all__ = ["GMLP_DEFAULTS", "gmlp_cifar", "gmlp_digits"]

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


register(
    "gmlp",
    {"gmlp_digits": {**GMLP_DEFAULTS, **DIGITS}, "gmlp_cifar": {**GMLP_DEFAULTS, **CIFAR}},
)
