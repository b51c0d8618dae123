"""MLP-Mixer (Tolstikhin et al. 2021) on timm's :class:`~timm.models.MlpMixer`: options, presets, Ω.

A Mixer block on the token table X (S tokens × C channels) is token mixing, an MLP of hidden
width γt·S applied to each of the C columns, then channel mixing, an MLP of hidden width γc·C
applied to each of the S rows. Hayase & Karakida read it as an MLP of width m = S·C whose
weights are Kronecker products (I_C ⊗ W for token mixing, W ⊗ I_S for channel mixing), so each
of its four linear maps per block is an "effective layer" of m inputs with γt·C·S² or γc·C²·S
non-zero weights.

The config speaks the paper's language: ``token_expansion`` γt is relative to S and
``channel_expansion`` γc to C. timm's ``mlp_ratio`` has both relative to C, so the token ratio
passed to timm is γt·S/C.


The family's knowledge lives here and is registered once (:mod:`models.families`): options
(:class:`MixerOptions`, shared with the RP-Mixer), the whole-width checks, γ, the Ω of a
:class:`~timm.models.mlp_mixer.MixerBlock`, the fixed-Ω grid (C solving
(γt·C·S² + γc·C²·S)/2 = Ω for each patching) and the training recipe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import Field
from timm.models import MlpMixer
from timm.models.mlp_mixer import MixerBlock

from models._builder import COMMON_DEFAULTS, Presets, check_divisible
from models.connections import linear_connections
from models.errors import ConfigError
from models.families import Recipe, register_family
from models.grids import shape_solver
from models.schema import MAX_EXPANSION, CommonOptions, tokens, whole

__all__ = [
    "MIXER_CIFAR",
    "MIXER_DEFAULTS",
    "MIXER_FAMILY",
    "MIXER_PRESETS",
    "MixerOptions",
    "check_mixer",
    "mixer_block_connections",
    "mixer_gamma",
    "mixer_grid",
    "mixer_kwargs",
]

# Options shared by the Mixer and the RP-Mixer, at the shared sizes (models._builder.DIGITS,
# CIFAR). digits (S = 16, C = 32, m = 512): γt = γc = 2 gives Ω = (γt·C·S² + γc·C²·S)/2 =
# (16384 + 32768)/2 = 24576 connections per effective layer, which the default SW-MLP
# (p = (1/S + 1/C)/2 = 3/64) matches exactly: p·γ·m² = 3/64 · 2 · 512² = 24576.
MIXER_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    "token_expansion": 2.0,
    "channel_expansion": 2.0,
}
# cifar (S = C = 64): γ = 4 is the Mixer paper's channel expansion, used for tokens too so the
# default SW-MLP matches Ω = γ·S·C·(S + C)/2 = 2²⁰.
MIXER_CIFAR: dict[str, Any] = {"token_expansion": 4.0, "channel_expansion": 4.0}


class MixerOptions(CommonOptions):
    """MLP-Mixer and RP-Mixer: expansions relative to S (tokens) and C (channels)."""

    token_expansion: float = Field(
        gt=0.0,
        le=MAX_EXPANSION,
        description="γt: token-mixing hidden width over S; γt·S must be whole",
    )
    channel_expansion: float = Field(
        gt=0.0,
        le=MAX_EXPANSION,
        description="γc: channel-mixing hidden width over C; γc·C must be whole",
    )


def check_mixer(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """Hidden widths γt·S and γc·C must be whole numbers."""
    s = tokens(variant, config)
    whole(variant, "token_expansion", config["token_expansion"] * s, "γt·S")
    whole(variant, "channel_expansion", config["channel_expansion"] * config["embed_dim"], "γc·C")
    return config


def mixer_gamma(config: Mapping[str, Any], s: int, c: int) -> float:
    """γ such that Ω = γ·S·C·(S + C)/2 (γt = γc = γ gives the paper's formula)."""
    gt, gc = float(config["token_expansion"]), float(config["channel_expansion"])
    return (gt * s + gc * c) / (s + c)


def mixer_block_connections(block: Any, s: int, c: int) -> list[int] | None:
    """Token weights act as I_C ⊗ W (C copies), channel weights as W ⊗ I_S (S copies)."""
    if not isinstance(block, MixerBlock):  # also the RP-Mixer block
        return None
    return [
        *(c * linear_connections(fc) for fc in (block.mlp_tokens.fc1, block.mlp_tokens.fc2)),
        *(s * linear_connections(fc) for fc in (block.mlp_channels.fc1, block.mlp_channels.fc2)),
    ]


def _omega_coefficients(config: Mapping[str, Any]) -> tuple[float, float]:
    """(a, b) with Ω = a·C² + b·C at the config's S and expansions."""
    s = (config["img_size"] // config["patch_size"]) ** 2
    a = float(config["channel_expansion"]) * s / 2.0
    b = float(config["token_expansion"]) * (s * s / 2.0)
    return a, b


mixer_grid = shape_solver(_omega_coefficients)


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


MIXER_PRESETS = Presets("mixer", MixerOptions, MlpMixer, mixer_kwargs, MIXER_DEFAULTS, MIXER_CIFAR)
MIXER_PRESETS.register_with_timm(
    __name__,
    mixer_digits="MLP-Mixer for 8×8 digits: S = 16, C = 32, γt = γc = 2, 4 blocks.",
    mixer_cifar="MLP-Mixer for 32×32 CIFAR images: S = C = 64, γt = γc = 4, 8 blocks.",
)
# The recipe (the RP-Mixer's too) is tuned so that every *_digits preset passes 90 % test
# accuracy on digits with margin and the whole zoo trains in well under five minutes on a
# 2-core CPU (see README for the table).
MIXER_FAMILY = register_family(
    MIXER_PRESETS.family(
        recipe=Recipe(epochs=30, lr=3e-3),
        check=check_mixer,
        gamma=mixer_gamma,
        block_connections=mixer_block_connections,
        grid=mixer_grid,
        rank=0,
    )
)
