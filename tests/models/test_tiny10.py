"""Tiny-10 is Kornblith et al.'s plain CNN: layer shapes, no residual, options, round trips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models
from analysis import ImageDataset
from analysis.layers import LayerReader, default_layers
from analysis.studies import plan

LAYERS = ["stem", *(f"blocks.{i}" for i in range(7)), "pre_logits"]
# Kornblith 2019, Tiny-10 with w = 16: (channels, side) of each layer's output. digits: 8×8
# images, two stride-2 steps (8 → 4 → 2), the 7th conv padded; cifar: 32×32, the 7th conv
# valid (8 → 6).
EXPECTED = {
    "tiny10_digits": ((1, 8), [(16, 8), (16, 8), (32, 4), (32, 4), (32, 4), (64, 2), (64, 2),
                               (64, 2)]),
    "tiny10_cifar": ((3, 32), [(16, 32), (16, 32), (32, 16), (32, 16), (32, 16), (64, 8), (64, 6),
                               (64, 6)]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_layers_have_the_papers_channels_and_sides(name: str) -> None:
    (chans, side), convs = EXPECTED[name]
    model = models.create(name, seed=1).eval()
    assert default_layers(model) == LAYERS
    assert models.input_spec(model).shape == (chans, side, side)
    x = torch.rand(3, chans, side, side)
    features = LayerReader(model, LAYERS)(x)
    assert [f.shape[1] for f in features] == [c * s * s for c, s in convs] + [64]
    assert model(x).shape == (3, 10)


def test_every_layer_replaces_the_representation() -> None:
    """Each block's output is ReLU(BN(conv(previous output))) in eval mode: nothing is added."""
    model: Any = models.create("tiny10_digits", seed=3)
    norms: list[Any] = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:  # BN statistics away from 0 and 1, so the formula is tested
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        torch.nn.init.uniform_(bn.weight, 0.5, 1.5)
        torch.nn.init.uniform_(bn.bias, -0.2, 0.2)
    model.eval()
    x = torch.rand(4, 1, 8, 8)
    features = LayerReader(model, LAYERS, feature="flatten")(x)
    previous = x
    for layer, out in zip([model.stem, *model.blocks], features[:-1], strict=True):
        conv, bn = layer[0], layer[1]
        z = F.conv2d(previous, conv.weight, stride=conv.stride, padding=conv.padding)
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        z = (z - bn.running_mean[:, None, None]) * scale[:, None, None] + bn.bias[:, None, None]
        previous = torch.clamp(z, min=0.0)
        torch.testing.assert_close(out, previous.flatten(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(features[-1], previous.mean(dim=(2, 3)), rtol=1e-5, atol=1e-6)


def test_structure_has_no_tokens_nor_connections() -> None:
    assert models.structure("tiny10_digits") == {
        "family": "tiny10",
        "omega": None,
        "effective_width": None,
        "density": None,
        "S": None,
        "C": None,
        "gamma": None,
    }
    assert models.family_of("tiny10_cifar").name == "tiny10"  # type: ignore[union-attr]


def test_width_scales_every_layer() -> None:
    model: Any = models.create("tiny10_digits", width=4)
    assert [blk[0].out_channels for blk in [model.stem, *model.blocks]] == [
        4,
        4,
        8,
        8,
        8,
        16,
        16,
        16,
    ]
    assert model.head.in_features == 16


def test_construction_is_a_function_of_the_seed() -> None:
    torch.manual_seed(1)
    a: Any = models.create("tiny10_digits", seed=7)
    torch.manual_seed(2)
    b = models.create("tiny10_digits", seed=7)
    c: Any = models.create("tiny10_digits", seed=8)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert not torch.equal(a.stem[0].weight, c.stem[0].weight)


@pytest.mark.parametrize(
    ("arch", "options", "message"),
    [
        ("tiny10_cifar", {"img_size": 8}, r"'img_size' of tiny10_cifar: 8 pixels .* 9 or more"),
        ("tiny10_digits", {"width": 2048}, r"option 'width' .*less than or equal to 1024"),
        ("tiny10_digits", {"valid_padding": 2}, r"option 'valid_padding'"),
        ("tiny10_digits", {"patch_size": 2}, r"unknown option 'patch_size' for tiny10_digits"),
    ],
)  # fmt: skip
def test_bad_options_fail_with_one_sentence(arch: str, options: dict, message: str) -> None:
    with pytest.raises(models.ConfigError, match=message):
        models.create(arch, **options)


def test_valid_padding_needs_nine_pixels() -> None:
    # 9 → 9 → 9 → 5 → 5 → 5 → 3 → 1 (valid 3×3) → 1: the smallest image with a pixel left.
    model = models.create("tiny10_cifar", img_size=9, in_chans=1)
    assert LayerReader(model, ["blocks.6"])(torch.rand(2, 1, 9, 9))[0].shape == (2, 64)


def test_round_trip_and_one_epoch_of_its_recipe(tmp_path: Path) -> None:
    model = models.create("tiny10_digits", seed=1).eval()
    x = torch.rand(5, 1, 8, 8)
    loaded, meta = models.load(models.save(model, tmp_path / "t.safetensors"))
    assert torch.equal(loaded(x), model(x)) and meta["arch"] == "tiny10_digits"
    rng = np.random.default_rng(0)
    data = ImageDataset(
        name="t", x=rng.random((40, 1, 8, 8), dtype=np.float32), y=np.arange(40) % 10
    )
    path = models.train("tiny10_digits", data, out_dir=tmp_path / "zoo", epochs=1, seed=2)
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["family"] == "tiny10" and sidecar["training"]["lr"] == 3e-3
    assert sidecar["metrics"]["test"]["n"] == 8


def test_the_docs_tiny10_identification_spec_plans_ten_trainings_of_its_recipe() -> None:
    root = Path(__file__).resolve().parents[2]
    study = plan(root / "docs" / "examples" / "layer_identification_tiny10.yaml")
    assert [t.arch for t in study.trainings] == ["tiny10_digits"] * 10
    assert sorted(t.seed for t in study.trainings) == list(range(10))
    assert {t.train_kwargs()["epochs"] for t in study.trainings} == {15}
    assert study.reference.structure["omega"] is None
