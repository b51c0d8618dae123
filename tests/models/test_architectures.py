"""Presets build through timm, have the agreed shapes and module names, and behave as specified."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models.mlp_mixer import MixerBlock

import models
from models.rp_mixer import RandomPermutedMixerBlock

PRESETS = [
    "mixer_digits", "sw_mlp_digits", "rp_mixer_digits", "gmlp_digits", "mlp_digits",
    "mixer_cifar", "sw_mlp_cifar", "rp_mixer_cifar", "gmlp_cifar", "mlp_cifar",
]  # fmt: skip
# The plain CNN (no tokens: tests/models/test_tiny10.py checks its shapes).
CNN_PRESETS = ["tiny10_digits", "tiny10_cifar"]
# About a billion stored weights each: shapes are checked without allocating them.
ON_META = {"sw_mlp_cifar", "mlp_cifar"}
# preset -> (C, H, W, S tokens, C channels, block output shape without the batch)
SHAPES = {
    "digits": ((1, 8, 8), 16, 32),
    "cifar": ((3, 32, 32), 64, 64),
}


def _build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    image, _, _ = SHAPES[name.rsplit("_", 1)[1]]
    if name in ON_META:
        with torch.device("meta"):
            return models.create(name), torch.empty(2, *image)
    return models.create(name), torch.rand(2, *image)


def test_preset_names_are_exactly_the_agreed_ones() -> None:
    digits = [p for p in PRESETS if p.endswith("_digits")] + CNN_PRESETS[:1]
    cifar = [p for p in PRESETS if p.endswith("_cifar")] + CNN_PRESETS[1:]
    assert models.list_presets() == digits + cifar


@pytest.mark.parametrize("name", PRESETS)
def test_output_and_feature_shapes(name: str) -> None:
    model, x = _build(name)
    image, tokens, channels = SHAPES[name.rsplit("_", 1)[1]]
    vector = name.startswith(("sw_mlp", "mlp"))
    assert models.input_spec(model).shape == image
    assert models.effective_width(model) == tokens * channels
    assert model(x).shape == (2, 10)
    features = model.forward_features(x)
    assert features.shape == ((2, tokens * channels) if vector else (2, tokens, channels))
    assert model.forward_head(features, pre_logits=True).shape == (2, channels)
    names = dict(model.named_modules())
    assert {"stem", "blocks.0", "norm", "head"} <= set(names)
    last, intermediates = model.forward_intermediates(x, output_fmt="NLC")
    assert len(intermediates) == len(model.blocks)
    assert all(t.shape == (2, tokens, channels) for t in intermediates)
    assert last.shape == features.shape


def test_timm_create_model_builds_presets_with_overrides() -> None:
    model = timm.create_model("mixer_digits", num_classes=3, seed=5)
    assert model.atlas_config["config"]["num_classes"] == 3
    assert model.atlas_config["config"]["seed"] == 5
    assert model.pretrained_cfg["input_size"] == (1, 8, 8)
    assert model(torch.rand(1, 1, 8, 8)).shape == (1, 3)


def test_mixer_hidden_widths_follow_expansions_relative_to_s_and_c() -> None:
    model = models.create("mixer_digits", token_expansion=1.5, channel_expansion=3)
    block = model.blocks[0]
    assert block.mlp_tokens.fc1.weight.shape == (int(1.5 * 16), 16)
    assert block.mlp_channels.fc1.weight.shape == (3 * 32, 32)


def test_construction_is_a_function_of_the_config(digits_batch: torch.Tensor) -> None:
    torch.manual_seed(123)
    a = models.create("mixer_digits", seed=7)
    torch.manual_seed(456)
    b = models.create("mixer_digits", seed=7)
    c = models.create("mixer_digits", seed=8)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert not torch.equal(a.blocks[0].mlp_tokens.fc1.weight, c.blocks[0].mlp_tokens.fc1.weight)


def test_gmlp_spatial_gate_starts_near_zero_with_unit_bias() -> None:
    model = models.create("gmlp_digits")
    for block in model.blocks:
        proj = block.mlp_channels.gate.proj
        assert proj.weight.shape == (16, 16)
        assert proj.weight.abs().max() < 1e-4
        assert torch.equal(proj.bias, torch.ones(16))


def test_rp_mixer_permutations_are_fixed_by_the_seed() -> None:
    a, b = models.create("rp_mixer_digits", seed=3), models.create("rp_mixer_digits", seed=3)
    c = models.create("rp_mixer_digits", seed=4)
    perms = [(blk.perm_tokens, blk.perm_channels) for blk in a.blocks]
    for (pt, pc), blk in zip(perms, b.blocks, strict=True):
        assert torch.equal(pt, blk.perm_tokens) and torch.equal(pc, blk.perm_channels)
        assert torch.equal(torch.sort(pt).values, torch.arange(16 * 32))
    assert not torch.equal(perms[0][0], perms[1][0])  # a fresh draw per block
    assert not torch.equal(perms[0][0], c.blocks[0].perm_tokens)
    assert "blocks.0.perm_tokens" in a.state_dict()


def test_rp_block_with_transposition_and_identity_is_a_mixer_block() -> None:
    torch.manual_seed(0)
    mixer = MixerBlock(32, 16, (1.0, 2.0))
    rp = RandomPermutedMixerBlock(32, 16, (1.0, 2.0))  # no generator: the Mixer's permutations
    rp.load_state_dict({**mixer.state_dict(), "perm_tokens": rp.perm_tokens,
                        "perm_channels": rp.perm_channels})  # fmt: skip
    x = torch.randn(3, 16, 32)
    torch.testing.assert_close(rp(x), mixer(x), rtol=1e-6, atol=1e-6)


def test_rp_block_with_random_permutations_differs_from_the_mixer() -> None:
    model = models.create("rp_mixer_digits")
    block = model.blocks[0]
    mixer = MixerBlock(32, 16, (1.0, 2.0))
    mixer.load_state_dict({k: v for k, v in block.state_dict().items() if "perm" not in k})
    x = torch.randn(3, 16, 32)
    assert not torch.allclose(block(x), mixer(x))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"colour": 1}, "unknown option"),
        ({"img_size": 9}, "option .patch_size. of mixer_digits: 2 does not divide img_size 9"),
        ({"pretrained": True}, "no pretrained weights"),
    ],
)
def test_bad_options_fail_with_config_errors(options: dict, message: str) -> None:
    with pytest.raises(models.ConfigError, match=message):
        models.create("mixer_digits", **options)


def test_unknown_architecture_lists_the_presets() -> None:
    with pytest.raises(
        models.ConfigError, match=r"unknown architecture 'mixer_huge'.*mixer_digits"
    ):
        models.create("mixer_huge")


def test_timm_names_build_and_get_an_atlas_config() -> None:
    model = models.create("gmlp_ti16_224", img_size=32, num_classes=10)
    assert model.atlas_config == {
        "arch": "gmlp_ti16_224",
        "family": "timm",
        "config": {"img_size": 32, "num_classes": 10},
    }
    assert models.input_spec(model).shape == (3, 32, 32)
    assert models.input_spec(model).mean == (0.5, 0.5, 0.5)


def test_timm_device_kwarg_builds_large_presets_on_meta_without_drawing_masks() -> None:
    model = models.create("sw_mlp_cifar", device="meta")
    fc1 = model.blocks[0].mlp.fc1
    assert fc1.mask.device.type == "meta" and fc1.weight.shape == (16384, 4096)
    assert fc1.nnz == round(4096 * 16384 / 64)
    assert "device" not in model.atlas_config["config"]
