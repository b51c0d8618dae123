"""Ω, exact mask counts, and masks that survive training (Hayase & Karakida's SW-MLP)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import models
from models.sw_mlp import MaskedLinear


def mixer_omega(s: int, c: int, gamma_t: float, gamma_c: float) -> float:
    """Average non-zeros over a Mixer block's four effective layers (I_C ⊗ W, W ⊗ I_S)."""
    return (gamma_t * c * s**2 + gamma_c * c**2 * s) / 2


def test_mixer_and_default_sw_mlp_have_the_same_omega_on_digits() -> None:
    s, c, gamma = 16, 32, 2
    expected = mixer_omega(s, c, gamma, gamma)
    assert expected == 24576
    mixer, sw = models.create("mixer_digits"), models.create("sw_mlp_digits")
    assert models.connections(mixer) == expected
    assert models.connections(sw) == expected
    assert models.connections(models.create("rp_mixer_digits")) == expected
    m = s * c
    assert sw.density == (1 / s + 1 / c) / 2
    assert models.connections(models.create("mlp_digits")) == gamma * m * m


def test_omega_matches_on_the_meta_device_for_cifar() -> None:
    s = c = 64
    gamma = 4
    with torch.device("meta"):
        mixer, sw = models.create("mixer_cifar"), models.create("sw_mlp_cifar")
        dense, gmlp = models.create("mlp_cifar"), models.create("gmlp_cifar")
    assert models.connections(mixer) == models.connections(sw) == mixer_omega(s, c, gamma, gamma)
    assert models.connections(dense) == gamma * (s * c) ** 2
    # gMLP: W_in (S copies), the S×S gate (γ·C/2 copies), W_out (S copies), γ = 6.
    g = 6
    expected = (g * c * c * s + (g * c // 2) * s * s + (g * c // 2) * c * s) / 3
    assert models.connections(gmlp) == round(expected)


def test_masks_hold_exactly_round_p_numel_ones() -> None:
    model = models.create("sw_mlp_digits", density=0.1)
    layers = [m for m in model.modules() if isinstance(m, MaskedLinear)]
    assert len(layers) == 2 * len(model.blocks)
    for layer in layers:
        numel = layer.weight.numel()
        assert int(layer.mask.sum()) == round(0.1 * numel) == layer.nnz
        assert torch.count_nonzero(layer.weight) <= layer.nnz
        assert torch.all(layer.weight[~layer.mask] == 0)
    # Different layers draw different masks; the same seed draws the same ones.
    assert not torch.equal(layers[0].mask, layers[2].mask)
    again = models.create("sw_mlp_digits", density=0.1)
    assert torch.equal(again.blocks[1].mlp.fc2.mask, model.blocks[1].mlp.fc2.mask)


def test_initial_scale_follows_effective_fan_in() -> None:
    model = models.create("sw_mlp_digits")
    fc1 = model.blocks[0].mlp.fc1
    live = fc1.weight.detach()[fc1.mask]
    expected_std = (fc1.density * fc1.in_features) ** -0.5
    assert abs(float(live.std()) / expected_std - 1) < 0.05  # 24576 samples: ~0.5 % noise


def test_masked_weights_stay_exactly_zero_after_adamw_steps() -> None:
    torch.manual_seed(0)
    model = models.create("sw_mlp_digits")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x, y = torch.rand(32, 1, 8, 8), torch.randint(0, 10, (32,))
    for _ in range(5):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    for name, module in model.named_modules():
        if isinstance(module, MaskedLinear):
            assert torch.all(module.weight[~module.mask] == 0), name
            assert not torch.equal(module.weight, before[f"{name}.weight"]), name
            assert int(module.mask.sum()) == module.nnz


def test_dense_mlp_has_no_masks() -> None:
    model = models.create("mlp_digits")
    assert not any(isinstance(m, MaskedLinear) for m in model.modules())
    assert not any("mask" in key for key in model.state_dict())
    assert models.parameter_count(model, free=True) == models.parameter_count(model)
