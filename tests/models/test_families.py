"""A family owns its knowledge: a toy family defined here goes through every generic function.

Nothing outside this file knows the toy family. It declares its options, checks, structure,
fixed-Ω grid and recipe, registers its factory with timm and itself with models.families, and
then option validation, structure, a grid point and a one-step training run through the
library's generic code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from timm.layers.patch_embed import PatchEmbed
from timm.models import generate_default_cfgs, register_model
from torch import nn

import models
from analysis import ImageDataset
from models import families
from models._builder import build_preset, default_cfg
from models.grids import shape_solver
from models.schema import tokens

TOY = "toy_channel_mlp_digits"


class ToyOptions(BaseModel):
    """Patches of an 8×8 image, C channels per token, channel MLPs of hidden width h·C."""

    model_config = ConfigDict(extra="forbid", strict=True)

    img_size: int = Field(ge=1, le=64)
    in_chans: int = Field(ge=1, le=3)
    num_classes: int = Field(ge=1, le=100)
    patch_size: int = Field(ge=1, le=64)
    embed_dim: int = Field(ge=1, le=256)
    num_blocks: int = Field(ge=1, le=8)
    hidden: int = Field(ge=1, le=8)
    seed: int = Field(ge=0, le=1000)


class ToyBlock(nn.Module):
    """x + W2 · GELU(W1 · x) on every token's channels."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden * dim)
        self.fc2 = nn.Linear(hidden * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update: torch.Tensor = self.fc2(nn.functional.gelu(self.fc1(x)))
        return x + update


class ToyNet(nn.Module):
    """Mixer layout (stem, blocks, head) without token mixing."""

    def __init__(self, **config: Any) -> None:
        super().__init__()
        device = config.pop("device", None)
        self.embed_dim, self.num_classes = config["embed_dim"], config["num_classes"]
        self.in_chans = config["in_chans"]
        self.stem = PatchEmbed(
            config["img_size"], config["patch_size"], config["in_chans"], self.embed_dim
        )
        self.blocks = nn.Sequential(
            *[ToyBlock(self.embed_dim, config["hidden"]) for _ in range(config["num_blocks"])]
        )
        self.head = nn.Linear(self.embed_dim, self.num_classes)
        if device is not None:
            self.to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.blocks(self.stem(x)).mean(dim=1))
        return logits


DEFAULTS: dict[str, Any] = {
    "img_size": 8,
    "in_chans": 1,
    "num_classes": 10,
    "patch_size": 2,
    "embed_dim": 8,
    "num_blocks": 2,
    "hidden": 2,
    "seed": 0,
}

default_cfgs = generate_default_cfgs({TOY: default_cfg((1, 8, 8))})


@register_model
def toy_channel_mlp_digits(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    return build_preset(TOY, "toy", ToyNet, DEFAULTS, kwargs, dict, pretrained=pretrained)


def _check(variant: str, config: dict[str, Any]) -> dict[str, Any]:
    tokens(variant, config)  # the patches tile the image
    return config


def _block_connections(block: Any, s: int, c: int) -> list[int] | None:
    # A channel weight acts on the m = S·C vector as W ⊗ I_S: S copies of it.
    if not isinstance(block, ToyBlock):
        return None
    return [s * block.fc1.weight.numel(), s * block.fc2.weight.numel()]


def _coefficients(config: Mapping[str, Any]) -> tuple[float, float]:
    s = (config["img_size"] // config["patch_size"]) ** 2
    return float(config["hidden"] * s), 0.0  # Ω = h·S·C²


TOY_FAMILY = families.Family(
    name="toy",
    options=ToyOptions,
    presets={TOY: DEFAULTS},
    recipe=families.Recipe(epochs=1, lr=1e-2, batch_size=256),
    check=_check,
    gamma=lambda config, s, c: float(config["hidden"]),
    block_connections=_block_connections,
    grid=shape_solver(_coefficients),
)


@pytest.fixture
def toy() -> Iterator[families.Family]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
        yield families.register_family(TOY_FAMILY)


def test_toy_family_validates_its_options(toy: families.Family) -> None:
    assert TOY in models.list_presets()
    assert models.validate_config(TOY, {"embed_dim": 12}) == {**DEFAULTS, "embed_dim": 12}
    with pytest.raises(models.ConfigError, match=r"option 'embed_dim' .*less than or equal to 256"):
        models.validate_config(TOY, {"embed_dim": 1000})
    with pytest.raises(models.ConfigError, match=r"unknown option 'density' for " + TOY):
        models.validate_config(TOY, {"density": 0.5})
    with pytest.raises(models.ConfigError, match=r"'patch_size' .*does not divide img_size 8"):
        models.create(TOY, patch_size=3)
    ranges = {o["key"]: o["range"] for o in models.option_schema(TOY)}
    assert ranges["hidden"] == {"ge": 1, "le": 8}


def test_toy_family_structure_and_grid_point(toy: families.Family) -> None:
    s, c, h = 16, 12, 2
    assert models.structure(TOY, {"embed_dim": c}) == {
        "family": "toy",
        "omega": h * s * c * c,  # two layers of S copies of an h·C × C weight
        "effective_width": s * c,
        "density": None,
        "S": s,
        "C": c,
        "gamma": float(h),
    }
    (point,) = models.fixed_omega_grid(TOY, h * s * c * c, shapes=[{"patch_size": 2}])
    assert point.options == {"patch_size": 2, "embed_dim": c} and point.omega == h * s * c * c
    assert models.connections(models.create(TOY, embed_dim=c)) == h * s * c * c


def test_toy_family_trains_one_step_with_its_recipe(toy: families.Family, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = ImageDataset(
        name="toy-data",
        x=rng.random((40, 1, 8, 8), dtype=np.float32),
        y=np.arange(40) % 10,
    )
    steps: list[tuple[int, int]] = []
    path = models.train(TOY, data, out_dir=tmp_path, on_step=lambda d, t: not steps.append((d, t)))
    assert steps[-1] == (1, 1)  # 32 training images, batch size 256: one step of one epoch
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["family"] == "toy" and sidecar["preset"] == TOY
    assert sidecar["training"]["lr"] == 1e-2 and sidecar["training"]["epochs"] == 1
    model, _ = models.load(path)
    assert models.connections(model) == 2 * 16 * 8 * 8


def test_a_family_must_bound_every_option(toy: families.Family) -> None:
    class Unbounded(BaseModel):
        width: int = Field(ge=1)

    loose = families.Family(
        name="loose", options=Unbounded, presets={}, recipe=families.Recipe(epochs=1, lr=1.0)
    )
    with pytest.raises(models.ConfigError, match=r"options without a maximum: \['width'\]"):
        families.register_family(loose)
    with pytest.raises(models.ConfigError, match="'toy' is already registered"):
        families.register_family(TOY_FAMILY)
