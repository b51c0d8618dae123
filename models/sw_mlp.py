"""Static sparse-weight MLP (SW-MLP) of Hayase & Karakida (ICML 2024) and the dense MLP.

The model shares the Mixer's stem and head: a patch embedding gives the S × C token table,
which is flattened to a vector of width m = S·C. Each block is

    x + W2 · GELU(W1 · LN(x)),    W1: m → γ·m,  W2: γ·m → m,

where W1 and W2 are multiplied by fixed random 0/1 masks with exactly round(p·numel) ones
(:class:`MaskedLinear`). The masks are drawn from a generator seeded with the config's
``seed`` and stored as buffers, so a checkpoint carries them. Weights start N(0, 1/(p·fan_in)):
p·fan_in is the expected number of live inputs of a unit, so activations keep the scale of a
dense layer at initialisation. The default density p = (1/S + 1/C)/2 gives the Mixer's
Ω = γ·S·C·(S + C)/2 non-zero weights per layer. The dense MLP (``mlp_*``) is the same block
with p = 1 and plain :class:`torch.nn.Linear` layers.

After the final LayerNorm over m, the head reshapes the vector back to the (B, S, C) token
table and averages over tokens, exactly like the Mixer's head, so pre-logits have C features
in every family and heads are comparable across architectures.

Both families (``sw_mlp`` and the dense ``mlp``) are registered once at the bottom with their
options, checks, structure, fixed-Ω grid (for each width m the density p = Ω / (γ·m²); the
dense MLP has Ω = γ·m² at every width, so no grid) and training recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, TypedDict, Unpack

import torch
import torch.nn.functional as F
from pydantic import Field
from timm.layers.drop import DropPath
from timm.layers.mlp import Mlp
from timm.layers.patch_embed import PatchEmbed
from timm.layers.weight_init import lecun_normal_
from timm.models._features import feature_take_indices
from torch import nn

from models._builder import COMMON_DEFAULTS, Presets, check_divisible
from models.connections import linear_connections
from models.errors import ConfigError
from models.families import Recipe, register_family
from models.grids import GridPoint, grid_point, point_solver
from models.options import structure, validate_config
from models.schema import MAX_EXPANSION, CommonOptions, tokens, whole

__all__ = [
    "MLP_PRESETS",
    "SW_MLP_DEFAULTS",
    "SW_MLP_PRESETS",
    "MaskedLinear",
    "MlpOptions",
    "SparseMlpBlock",
    "SparseWeightMlp",
    "SwMlpOptions",
    "default_density",
]  # timm adds the entrypoints

# The shared sizes (models._builder.DIGITS, CIFAR). digits: S = 16 tokens of C = 32 channels
# flatten to width m = 512; γ = 2 and 4 blocks as in mixer_digits. Default p = (1/16 + 1/32)/2
# = 3/64, so each 512 × 1024 weight keeps 3/64 · 524288 = 24576 ones: Ω equals mixer_digits'.
SW_MLP_DEFAULTS: dict[str, Any] = {**COMMON_DEFAULTS, "mlp_ratio": 2.0, "density": None}
# cifar: S = C = 64 flatten to m = 4096; γ = 4 and 8 blocks as in mixer_cifar; p = 1/64 keeps
# 2²⁰ of the 2²⁶ weights of each 4096 × 16384 matrix. At about a billion stored weights
# (mlp_cifar: all dense) these two are meant for the meta device or a GPU.
_CIFAR = {"mlp_ratio": 4.0}

# LayerNorm as timm's Mixer uses it.
_LAYER_NORM = partial(nn.LayerNorm, eps=1e-6)


class Placement(TypedDict, total=False):
    """Where and in what type a module makes its tensors (timm's ``device`` and ``dtype``)."""

    device: Any
    dtype: Any


def _check_density(density: float) -> float:
    """``density`` if it is in (0, 1]: a share of the weights kept."""
    if not 0.0 < density <= 1.0:
        raise ConfigError(f"density must be in (0, 1], got {density:g}")
    return density


class MaskedLinear(nn.Linear):
    """A linear layer whose weight is multiplied by a fixed 0/1 mask with an exact count of ones.

    The mask holds exactly ``round(density * in_features * out_features)`` ones at positions
    drawn by ``randperm`` from ``generator``. It multiplies the weight in every forward, so
    the gradient of a masked weight is exactly zero; masked weights are also zeroed at
    initialisation, so AdamW (whose moments and decoupled decay keep a zero weight with zero
    gradient at zero) never moves them. On the meta device the mask is left undrawn.
    """

    mask: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        density: float,
        *,
        generator: torch.Generator,
        bias: bool = True,
        **dd: Unpack[Placement],
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, **dd)
        self.density = _check_density(density)
        numel = in_features * out_features
        self.nnz = max(1, round(density * numel))
        if self.weight.device.type == "meta":
            mask = torch.empty(out_features, in_features, dtype=torch.bool, device="meta")
        else:
            flat = torch.zeros(numel, dtype=torch.bool, device="cpu")
            flat[torch.randperm(numel, generator=generator, device="cpu")[: self.nnz]] = True
            mask = flat.reshape(out_features, in_features).to(self.weight.device)
        self.register_buffer("mask", mask)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 1/(p·fan_in)) weights, zero where masked, and zero biases."""
        if not hasattr(self, "mask"):  # nn.Linear.__init__ calls this before the mask exists
            return
        nn.init.normal_(self.weight, std=(self.density * self.in_features) ** -0.5)
        with torch.no_grad():
            self.weight.mul_(self.mask)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (W ⊙ M)ᵀ + b."""
        return F.linear(x, self.weight * self.mask, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, density={self.density:g}, nnz={self.nnz}"

    def connection_count(self) -> int:
        """Ones in the mask (the drawn count; ``nnz`` on the meta device, where none is drawn)."""
        if self.mask.device.type == "meta":
            return self.nnz
        return int(self.mask.sum())


class SparseMlpBlock(nn.Module):
    """x + W2 · GELU(W1 · LN(x)) on the width-m vector, with masked W1 and W2 when p < 1."""

    def __init__(
        self,
        width: int,
        mlp_ratio: float,
        density: float,
        *,
        generator: torch.Generator,
        norm_layer: Callable[..., nn.Module] = _LAYER_NORM,
        act_layer: type[nn.Module] = nn.GELU,
        drop: float = 0.0,
        drop_path: float = 0.0,
        **dd: Unpack[Placement],
    ) -> None:
        super().__init__()
        hidden = int(width * mlp_ratio)
        self.norm = norm_layer(width, **dd)
        if density >= 1.0:
            self.mlp = Mlp(width, hidden, act_layer=act_layer, drop=drop, **dd)
            for fc in self.mlp.modules():
                if isinstance(fc, nn.Linear):
                    nn.init.normal_(fc.weight, std=fc.in_features**-0.5)
                    nn.init.zeros_(fc.weight.new_empty(0) if fc.bias is None else fc.bias)
        else:
            # timm's Mlp supplies the act/dropout plumbing; its dense layers are placeholders on
            # the meta device (never allocated) replaced by the masked ones.
            self.mlp = Mlp(width, hidden, act_layer=act_layer, drop=drop, device="meta")
            sparse = partial(MaskedLinear, density=density, generator=generator, **dd)
            self.mlp.fc1 = sparse(in_features=width, out_features=hidden)
            self.mlp.fc2 = sparse(in_features=hidden, out_features=width)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update: torch.Tensor = self.drop_path(self.mlp(self.norm(x)))
        return x + update


class SparseWeightMlp(nn.Module):
    """SW-MLP (``density`` < 1) or dense MLP (``density`` = 1) with the Mixer's stem and head.

    Module names follow timm's MlpMixer (``stem``, ``blocks.{i}``, ``norm``, ``head``); block
    outputs are (B, m) vectors with m = S·C in the stem's token-major order, so
    ``x.reshape(B, S, C)`` recovers a token table.
    """

    def __init__(
        self,
        num_classes: int = 10,
        img_size: int = 8,
        in_chans: int = 1,
        patch_size: int = 2,
        embed_dim: int = 32,
        num_blocks: int = 4,
        mlp_ratio: float = 2.0,
        density: float = 1.0,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        seed: int = 0,
        **dd: Unpack[Placement],
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = "avg"
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.density = _check_density(density)
        self.grad_checkpointing = False
        self.stem = PatchEmbed(img_size, patch_size, in_chans, embed_dim, **dd)
        self.num_tokens = self.stem.num_patches
        self.width: int = self.num_tokens * embed_dim
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.blocks = nn.Sequential(
            *[
                SparseMlpBlock(
                    self.width,
                    mlp_ratio,
                    density,
                    generator=generator,
                    drop=proj_drop_rate,
                    drop_path=drop_path_rate,
                    **dd,
                )
                for _ in range(num_blocks)
            ]
        )
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": self.width, "reduction": patch_size}
            for i in range(num_blocks)
        ]
        self.norm = nn.LayerNorm(self.width, eps=1e-6, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head: nn.Module = nn.Linear(embed_dim, num_classes, **dd)
        # As timm's Mixer: LeCun-normal stem, zero head (the blocks initialise themselves).
        lecun_normal_(self.stem.proj.weight)
        for param in (self.stem.proj.bias, self.head.weight, self.head.bias):
            if param is not None:
                nn.init.zeros_(param)

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head (only average pooling over tokens is supported)."""
        if global_pool not in (None, "avg"):
            raise ConfigError("SparseWeightMlp only supports global_pool='avg'")
        self.num_classes = num_classes
        weight = self.stem.proj.weight
        self.head = (
            nn.Linear(self.embed_dim, num_classes, device=weight.device, dtype=weight.dtype)
            if num_classes > 0
            else nn.Identity()
        )

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], self.num_tokens, self.embed_dim)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``forward_intermediates``: block outputs as NCHW or NLC token tables."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ConfigError("output_fmt must be 'NCHW' or 'NLC'")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        batch = x.shape[0]
        height, width = self.stem.dynamic_feat_size((int(x.shape[-2]), int(x.shape[-1])))
        x = self.stem(x).flatten(1)
        blocks = self.blocks[: max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, block in enumerate(blocks):
            x = block(x)
            if i in take_indices:
                tokens = self._tokens(self.norm(x) if norm else x)
                if output_fmt == "NCHW":
                    tokens = tokens.reshape(batch, height, width, -1).permute(0, 3, 1, 2)
                intermediates.append(tokens.contiguous())
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Stem, flatten to (B, m), blocks, final LayerNorm: a (B, m) vector."""
        features: torch.Tensor = self.norm(self.blocks(self.stem(x).flatten(1)))
        return features

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Mean over the S tokens of the (B, S, C) table, then the linear classifier."""
        x = self.head_drop(self._tokens(x).mean(dim=1))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def default_density(tokens: int, channels: int) -> float:
    """p = (1/S + 1/C)/2: the density at which an SW-MLP has the Mixer's Ω for equal γ."""
    return (1.0 / tokens + 1.0 / channels) / 2.0


class SwMlpOptions(CommonOptions):
    """SW-MLP: expansion of the width m = S·C and the density of its weight masks."""

    mlp_ratio: float = Field(
        gt=0.0, le=MAX_EXPANSION, description="γ: hidden width over m = S·C; γ·m must be whole"
    )
    density: float | None = Field(
        gt=0.0,
        le=1.0,
        description="p: share of non-zero weights; unset means (1/S + 1/C)/2, the Mixer's Ω",
    )


class MlpOptions(CommonOptions):
    """Dense MLP: the SW-MLP block at density 1 (use an ``sw_mlp_*`` preset for p < 1)."""

    mlp_ratio: float = Field(
        gt=0.0, le=MAX_EXPANSION, description="γ: hidden width over m = S·C; γ·m must be whole"
    )
    density: float = Field(ge=1.0, le=1.0, description="always 1: every weight is a connection")


def _check(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    """γ·m must be whole; an unset density becomes (1/S + 1/C)/2, stored explicitly."""
    s = tokens(variant, config)
    dim = config["embed_dim"]
    whole(variant, "mlp_ratio", config["mlp_ratio"] * s * dim, "γ·m")
    if config["density"] is None:
        config["density"] = (1.0 / s + 1.0 / dim) / 2.0
    return config


def _gamma(config: Mapping[str, Any], s: int, c: int) -> float:
    return float(config["mlp_ratio"])


def _density(config: Mapping[str, Any], *_: int) -> float:
    return float(config["density"])


def _block_connections(block: Any, s: int, c: int) -> list[int] | None:
    """The two m-wide weights of a block, counted as they are (mask ones, or dense)."""
    if not isinstance(block, SparseMlpBlock):
        return None
    return [linear_connections(block.mlp.fc1), linear_connections(block.mlp.fc2)]


def _width_point(arch: str, omega: int, fixed: Mapping[str, Any], width: Any) -> GridPoint | None:
    """At width m (S from the patching, C = m / S; or an explicit shape) p = Ω / (γ·m²).

    Each masked weight then keeps round(p·γ·m²) = Ω ones; a width too narrow to hold Ω
    (p > 1) gives no point.
    """
    base = validate_config(arch, {**fixed, "density": 1.0})
    s = (base["img_size"] // base["patch_size"]) ** 2
    gamma = float(base["mlp_ratio"])
    if isinstance(width, Mapping):
        shape = dict(width)
        m = int(structure(arch, {**fixed, **shape, "density": 1.0})["effective_width"])
    else:
        m = int(width)
        if m < 1 or m % s:
            raise ConfigError(
                f"width {width} of {arch} is not a positive multiple of its S = {s} tokens"
            )
        shape = {"embed_dim": m // s}
    density = omega / (gamma * m * m)
    if density > 1.0:
        return None  # too narrow: even dense, this width has fewer than Ω connections
    return grid_point(arch, fixed, {**shape, "density": density}, omega)


def _kwargs(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    check_divisible(variant, config["img_size"], config["patch_size"])
    return dict(config)


# The two families of this module. The SW-MLP's presets leave the density unset (resolved to
# the Mixer's Ω); its recipe, tuned with the Mixer's (see models.mixer), passes 90 % on digits in
# 15 epochs. The dense MLP is the SW-MLP family at density 1 (recipe included), with no fixed-Ω
# grid: its Ω is γ·m² at every width.
SW_MLP_PRESETS = Presets("sw_mlp", SwMlpOptions, SparseWeightMlp, _kwargs, SW_MLP_DEFAULTS, _CIFAR)
MLP_PRESETS = replace(
    SW_MLP_PRESETS, name="mlp", options=MlpOptions, defaults={**SW_MLP_DEFAULTS, "density": 1.0}
)
SW_MLP_FAMILY = SW_MLP_PRESETS.family(
    recipe=Recipe(epochs=15, lr=1e-3),
    check=_check,
    gamma=_gamma,
    density=_density,
    block_connections=_block_connections,
    grid=point_solver("widths", "effective widths m", _width_point),
    rank=1,
)
MLP_FAMILY = MLP_PRESETS.family(like=SW_MLP_FAMILY, grid=None, rank=4)
register_family(SW_MLP_FAMILY)
register_family(MLP_FAMILY)
SW_MLP_PRESETS.register_with_timm(
    __name__,
    sw_mlp_digits="SW-MLP for 8×8 digits: m = 16·32 = 512, γ = 2, p = 3/64, 4 blocks.",
    sw_mlp_cifar="SW-MLP for 32×32 CIFAR images: m = 64·64 = 4096, γ = 4, p = 1/64, 8 blocks.",
)
MLP_PRESETS.register_with_timm(
    __name__,
    mlp_digits="Dense MLP for 8×8 digits: m = 512, γ = 2, 4 blocks (the SW-MLP block, p = 1).",
    mlp_cifar="Dense MLP for 32×32 CIFAR images: m = 4096, γ = 4, 8 blocks; for meta or a GPU.",
)
