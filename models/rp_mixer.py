"""Random-permuted MLP-Mixer (RP-Mixer) of Hayase & Karakida (ICML 2024), on timm's MlpMixer.

Flatten the token table X (S × C) to a vector of width m = S·C. A Mixer's token mixing is the
block-diagonal map I_C ⊗ W applied after a *transposition* (the permutation that makes every
group of S consecutive entries one channel's column), and channel mixing is the same with
groups of C entries along a row. The RP-Mixer keeps the weights and the grouping but replaces
each transposition by a fixed random permutation P of the m entries: a mixing layer becomes
Pᵀ (I ⊗ W) P, a block-diagonal weight whose blocks no longer line up with rows or columns, so
the effective m × m weight looks like an unstructured sparse matrix (the SW-MLP) while costing
no more than a Mixer. Each block draws two permutations (one for token mixing, one for channel
mixing) from a generator seeded with the config's ``seed``; they are persistent buffers, so
checkpoints carry them.

The residual stream stays the (B, S, C) token table and each mixing is wrapped by P and Pᵀ, so
block outputs, LayerNorms (over C) and the head are exactly those of the Mixer. With the
token permutation set to the transposition and the channel permutation to the identity the
block *is* timm's :class:`~timm.models.mlp_mixer.MixerBlock`, which the tests check.

The permutations do not change the weights' sizes, so the family takes the Mixer's options,
checks, γ, Ω (an RP-Mixer block is a MixerBlock) and fixed-Ω grid: its record,
recipe included, is :data:`models.mixer.MIXER_FAMILY` with its own presets and rank.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch
from timm.models.mlp_mixer import MixerBlock
from torch import nn

from models.families import register_family
from models.mixer import MIXER_FAMILY, MIXER_PRESETS, mixer_kwargs

__all__ = ["RP_MIXER_PRESETS", "RandomPermutedMixerBlock"]  # timm adds the entrypoints


class RandomPermutedMixerBlock(MixerBlock):
    """A :class:`MixerBlock` whose transpositions are fixed random permutations of S·C entries.

    ``generator`` supplies the two permutations; blocks built in order from one generator get
    reproducible, distinct permutations. Without a generator the permutations are those that
    make this block compute exactly what a Mixer block computes.
    """

    perm_tokens: torch.Tensor
    perm_channels: torch.Tensor

    def __init__(
        self,
        dim: int,
        seq_len: int,
        mlp_ratio: Any = (0.5, 4.0),
        *,
        generator: torch.Generator | None = None,
        device: Any = None,
        dtype: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, seq_len, mlp_ratio, device=device, dtype=dtype, **kwargs)
        self.seq_len = seq_len
        width = seq_len * dim
        target = torch.device(device) if device is not None else torch.empty(0).device
        if target.type == "meta":  # a weightless build (structure, budget) draws nothing
            tokens = channels = torch.empty(width, dtype=torch.long, device="meta")
        elif generator is None:
            tokens = torch.arange(width).reshape(seq_len, dim).t().reshape(-1)
            channels = torch.arange(width)
        else:
            tokens = torch.randperm(width, generator=generator, device="cpu")
            channels = torch.randperm(width, generator=generator, device="cpu")
        self.register_buffer("perm_tokens", tokens.to(target))
        self.register_buffer("perm_channels", channels.to(target))

    @staticmethod
    def _mix(x: torch.Tensor, perm: torch.Tensor, groups: int, mlp: nn.Module) -> torch.Tensor:
        """Pᵀ (I ⊗ W) P x: permute, mix each group of ``len(perm) / groups`` entries, unpermute."""
        batch = x.shape[0]
        flat = x.reshape(batch, -1)[:, perm].reshape(batch, groups, -1)
        mixed: torch.Tensor = mlp(flat).reshape(batch, -1)
        return mixed[:, torch.argsort(perm)].reshape(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token mixing on permuted groups of S, then channel mixing on permuted groups of C."""
        channels = x.shape[-1]
        x = x + self.drop_path(
            self._mix(self.norm1(x), self.perm_tokens, channels, self.mlp_tokens)
        )
        x = x + self.drop_path(
            self._mix(self.norm2(x), self.perm_channels, self.seq_len, self.mlp_channels)
        )
        return x


def _kwargs(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    # One generator for the whole model: blocks, built in order, draw distinct permutations.
    generator = torch.Generator(device="cpu").manual_seed(int(config["seed"]))
    return {
        **mixer_kwargs(variant, config),
        "block_layer": partial(RandomPermutedMixerBlock, generator=generator),
    }


# The Mixer's presets (sizes, options) under the RP-Mixer's name and with its blocks.
RP_MIXER_PRESETS = replace(MIXER_PRESETS, name="rp_mixer", translate=_kwargs)
RP_MIXER_PRESETS.register_with_timm(
    __name__,
    rp_mixer_digits="RP-Mixer at the sizes of ``mixer_digits`` (S = 16, C = 32, γ = 2, 4 blocks).",
    rp_mixer_cifar="RP-Mixer at the sizes of ``mixer_cifar`` (S = C = 64, γ = 4, 8 blocks).",
)
register_family(RP_MIXER_PRESETS.family(like=MIXER_FAMILY, rank=2))
