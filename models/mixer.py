"""MLP-Mixer presets (Tolstikhin et al. 2021) built on timm's :class:`~timm.models.MlpMixer`.

A Mixer block on the token table X (S tokens × C channels) is token mixing, an MLP of hidden
width γt·S applied to each of the C columns, then channel mixing, an MLP of hidden width γc·C
applied to each of the S rows. Hayase & Karakida read it as an MLP of width m = S·C whose
weights are Kronecker products (I_C ⊗ W for token mixing, W ⊗ I_S for channel mixing), so each
of its four linear maps per block is an "effective layer" of m inputs with γt·C·S² or γc·C²·S
non-zero weights.

The config speaks the paper's language: ``token_expansion`` γt is relative to S and
``channel_expansion`` γc to C. timm's ``mlp_ratio`` has both relative to C, so the token ratio
passed to timm is γt·S/C.
"""

from __future__ import annotations

import math
from typing import Any

from timm.models import MlpMixer, generate_default_cfgs, register_model
from torch import nn

from models._builder import build_preset, check_divisible, default_cfg, register
from models.errors import ConfigError

__all__ = ["MIXER_DEFAULTS", "mixer_cifar", "mixer_digits", "mixer_kwargs"]

# Options shared by the Mixer and the RP-Mixer; presets override the sizes.
MIXER_DEFAULTS: dict[str, Any] = {
    "img_size": 8,
    "in_chans": 1,
    "num_classes": 10,
    "patch_size": 2,
    "embed_dim": 32,
    "num_blocks": 4,
    "token_expansion": 2.0,
    "channel_expansion": 2.0,
    "drop_rate": 0.0,
    "proj_drop_rate": 0.0,
    "drop_path_rate": 0.0,
    "seed": 0,
}

# digits: 8×8×1 images cut into 2×2 patches give S = 16 tokens; C = 32 channels makes the
# effective width m = S·C = 512 and keeps a 4-block model trainable in seconds on a CPU.
# γt = γc = 2 gives Ω = (γt·C·S² + γc·C²·S)/2 = (16384 + 32768)/2 = 24576 connections per
# effective layer, which the default SW-MLP (p = (1/S + 1/C)/2 = 3/64) matches exactly:
# p·γ·m² = 3/64 · 2 · 512² = 24576.
DIGITS = {"img_size": 8, "in_chans": 1, "patch_size": 2, "embed_dim": 32, "num_blocks": 4}
# cifar: 32×32×3 images cut into 4×4 patches give S = 64 tokens and C = 64 channels, the
# S = C = 64 of the paper's CKA experiment; γ = 4 is the Mixer paper's channel expansion, used
# for tokens too so the default SW-MLP matches Ω = γ·S·C·(S + C)/2 = 2²⁰; 8 blocks is Mixer-S.
CIFAR = {
    "img_size": 32,
    "in_chans": 3,
    "patch_size": 4,
    "embed_dim": 64,
    "num_blocks": 8,
    "token_expansion": 4.0,
    "channel_expansion": 4.0,
}


def _ratio(hidden: float, dim: int, what: str) -> float:
    """timm's ratio r with ``int(r * dim) == hidden`` (nudged up past float rounding)."""
    if hidden <= 0 or hidden != int(hidden):
        raise ConfigError(f"{what} hidden width {hidden:g} must be a positive whole number")
    ratio = hidden / dim
    while int(ratio * dim) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def mixer_kwargs(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """Translate a Mixer config into :class:`MlpMixer` kwargs (shared with the RP-Mixer)."""
    tokens = check_divisible(variant, config["img_size"], config["patch_size"])
    dim = int(config["embed_dim"])
    return {
        "img_size": config["img_size"],
        "in_chans": config["in_chans"],
        "num_classes": config["num_classes"],
        "patch_size": config["patch_size"],
        "embed_dim": dim,
        "num_blocks": config["num_blocks"],
        "mlp_ratio": (
            _ratio(config["token_expansion"] * tokens, dim, f"{variant} token-mixing"),
            _ratio(config["channel_expansion"] * dim, dim, f"{variant} channel-mixing"),
        ),
        "drop_rate": config["drop_rate"],
        "proj_drop_rate": config["proj_drop_rate"],
        "drop_path_rate": config["drop_path_rate"],
    }


def _create(variant: str, preset: dict[str, Any], pretrained: bool, **kwargs: Any) -> nn.Module:
    return build_preset(
        variant,
        "mixer",
        MlpMixer,
        {**MIXER_DEFAULTS, **preset},
        kwargs,
        lambda config: mixer_kwargs(variant, config),
        pretrained=pretrained,
    )


default_cfgs = generate_default_cfgs(
    {
        "mixer_digits": default_cfg((1, 8, 8)),
        "mixer_cifar": default_cfg((3, 32, 32)),
    }
)


@register_model
def mixer_digits(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """MLP-Mixer for 8×8 digits: S = 16, C = 32, γt = γc = 2, 4 blocks."""
    return _create("mixer_digits", DIGITS, pretrained, **kwargs)


@register_model
def mixer_cifar(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """MLP-Mixer for 32×32 CIFAR images: S = C = 64, γt = γc = 4, 8 blocks."""
    return _create("mixer_cifar", CIFAR, pretrained, **kwargs)


register(
    "mixer",
    {"mixer_digits": {**MIXER_DEFAULTS, **DIGITS}, "mixer_cifar": {**MIXER_DEFAULTS, **CIFAR}},
)
