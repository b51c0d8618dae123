"""The streaming atlas on real timm models: extraction, bookkeeping, caching, determinism."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from analysis import (
    Atlas,
    Cancelled,
    DirectoryGramCache,
    ImageDataset,
    LayerError,
    compare,
    default_layers,
    resolve_layers,
)
from analysis.layers import available_layers
from models import create

# timm MlpMixers on 16×16×3 images in 4×4 patches (S = 16 tokens of C = 32 channels), built by
# the project's families: the Mixer with timm's default ratios (γt = C/(2S) = 1, γc = 4), the
# gMLP with its γ = 6.
SIZES = {"img_size": 16, "in_chans": 3, "patch_size": 4, "embed_dim": 32}


def mixer(seed: int = 0, blocks: int = 3) -> nn.Module:
    return create(
        "mixer_digits",
        **SIZES,
        num_blocks=blocks,
        token_expansion=1.0,
        channel_expansion=4.0,
        seed=seed,
    )


def gmlp(seed: int = 0) -> nn.Module:
    return create("gmlp_digits", **SIZES, num_blocks=2, seed=seed)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(70, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def count_forwards(model: nn.Module) -> list[int]:
    """Counts forward passes: the stem runs exactly once in each."""
    calls = [0]
    model.stem.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def no_hooks(model: nn.Module) -> bool:
    return all(
        not (m._forward_hooks or m._forward_pre_hooks)  # type: ignore[truthy-function]
        for m in model.modules()
    )


def activations(model: nn.Module, x: torch.Tensor, names: list[str]) -> list[np.ndarray]:
    """Reads layers with the test's own hooks, independently of the engine."""
    got: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    handles = [
        mods[n].register_forward_hook(lambda _m, _i, o, n=n: got.__setitem__(n, o)) for n in names
    ]
    handles.append(
        mods["head"].register_forward_pre_hook(lambda _m, a: got.__setitem__("pre_logits", a[0]))
    )
    with torch.no_grad():
        model.eval()(x)
    for h in handles:
        h.remove()
    return [got[n].reshape(len(x), -1).double().numpy() for n in [*names, "pre_logits"]]


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
@pytest.mark.parametrize("estimator", ["biased", "unbiased"])
def test_atlas_matches_reference(
    images: torch.Tensor, kernel: str, estimator: str, ref: types.SimpleNamespace
) -> None:
    a, b = mixer(0), gmlp(1)
    atlas = compare({"a": a, "b": b}, images, kernel=kernel, estimator=estimator, batch_size=32)
    names_a = ["stem", "blocks.0", "blocks.1", "blocks.2", "norm"]
    names_b = ["stem", "blocks.0", "blocks.1", "norm"]
    assert atlas.layers == {"a": [*names_a, "pre_logits"], "b": [*names_b, "pre_logits"]}
    fa, fb = activations(a, images, names_a), activations(b, images, names_b)
    kw = {"kernel": kernel, "estimator": estimator, "batch_size": 32}
    np.testing.assert_allclose(atlas.matrix("a", "b"), ref.cka_matrix(fa, fb, **kw), atol=1e-5)
    np.testing.assert_allclose(atlas.matrix("b", "b"), ref.cka_matrix(fb, fb, **kw), atol=1e-5)
    assert atlas.n == 70 and atlas.diagnostics["batches"] == 3  # 32 + 32 + a ragged 6


def test_each_model_runs_once_per_batch(images: torch.Tensor) -> None:
    a, b = mixer(0), gmlp(1)
    ca, cb = count_forwards(a), count_forwards(b)
    atlas = compare({"a": a, "b": b}, images, batch_size=32)
    assert ca[0] == cb[0] == 3
    assert atlas.diagnostics["forward_passes"] == {"a": 3, "b": 3}
    # the hook path too (a submodule output forces hooks)
    compare({"a": a}, images, batch_size=32, layers=["blocks.0.mlp_channels.fc1", "pre_logits"])
    assert ca[0] == 6 and no_hooks_but_counter(a)


def no_hooks_but_counter(model: nn.Module) -> bool:
    return len(model.stem._forward_hooks) == 1 and all(
        not (m._forward_hooks or m._forward_pre_hooks)
        for m in model.modules()
        if m is not model.stem
    )


def test_hook_and_intermediate_paths_agree(images: torch.Tensor) -> None:
    a = mixer(2)
    fast = compare({"a": a}, images, batch_size=35, layers=["stem", "blocks.*", "pre_logits"])
    slow = compare(
        {"a": a}, images, batch_size=35, layers=["blocks.0.norm1", "stem", "blocks.*", "pre_logits"]
    )
    np.testing.assert_allclose(slow.matrix("a")[1:, 1:], fast.matrix("a"), atol=1e-12)


def test_layer_selection() -> None:
    a = mixer(0)
    assert default_layers(a) == ["stem", "blocks.0", "blocks.1", "blocks.2", "norm", "pre_logits"]
    assert resolve_layers(a, "blocks.*") == ["blocks.0", "blocks.1", "blocks.2"]
    assert resolve_layers(a, [-1, "0", "blocks.1"]) == ["pre_logits", "stem", "blocks.1"]
    assert resolve_layers(a, "blocks.**.fc1")[:2] == [
        "blocks.0.mlp_tokens.fc1",
        "blocks.0.mlp_channels.fc1",
    ]
    with pytest.raises(LayerError) as info:
        resolve_layers(a, ["blocks.0", "block.1"], model_name="model 'a'")
    assert str(info.value) == (
        "layer selection 'block.1' matches no layer of model 'a'; closest: blocks.1, blocks.2, "
        f"blocks.0; its {len(available_layers(a))} layers: stem, stem.proj, stem.norm, blocks, "
        "blocks.0–blocks.2, blocks.*.norm1, blocks.*.mlp_tokens, blocks.*.drop_path, "
        "blocks.*.norm2, blocks.*.mlp_channels, norm, head_drop, pre_logits, head and the "
        "modules inside them (blocks.*.mlp_tokens.fc1, …); "
        "analysis.available_layers(model) lists them all"
    )
    with pytest.raises(LayerError, match="out of range"):
        resolve_layers(a, [17])


def test_bad_selection_fails_before_any_forward(images: torch.Tensor) -> None:
    a, b = mixer(0), gmlp(1)
    ca, cb = count_forwards(a), count_forwards(b)
    with pytest.raises(LayerError, match="model 'b'"):
        compare({"a": a, "b": b}, images, layers={"a": None, "b": ["blocks.5"]})
    assert ca[0] == cb[0] == 0


class Exploding(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")


@pytest.mark.parametrize("layers", [["stem", "blocks.*"], ["blocks.0.norm1", "pre_logits"]])
def test_hooks_are_removed_after_an_error(images: torch.Tensor, layers: list[str]) -> None:
    a = mixer(0)
    a.blocks[1].mlp_channels.fc2 = Exploding()
    with pytest.raises(RuntimeError, match="boom"):
        compare({"a": a}, images, layers=layers, batch_size=32)
    assert no_hooks(a)
    assert a.training  # the mode is restored too


class Constant(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x) + 0.731


def test_constant_layer_gives_none_with_reason(images: torch.Tensor) -> None:
    a = mixer(0)
    a.blocks[1] = Constant()
    atlas = compare({"a": a}, images, batch_size=32, layers="blocks.*")
    m = atlas.matrix("a")
    # blocks.2 only sees a constant input, so it is constant too
    assert np.isnan(m[1:]).all() and np.isnan(m[:, 1:]).all() and m[0, 0] == pytest.approx(1.0)
    why = atlas.diagnostics["undefined_layers"]
    assert [w["layer"] for w in why] == ["blocks.1", "blocks.2"]
    assert all("constant" in w["reason"] for w in why)
    d = json.loads(json.dumps(atlas.to_dict(), allow_nan=False))
    assert d["matrices"][0]["cka"][1] == [None, None, None]


def test_round_trip_symmetry_and_bit_identical_repeat(images: torch.Tensor) -> None:
    models = {"a": mixer(0), "b": gmlp(1)}
    one = compare(models, images, batch_size=32, bootstrap=20, seed=3)
    two = compare(models, images, batch_size=32, bootstrap=20, seed=3)
    assert one.to_dict() == two.to_dict()
    np.testing.assert_array_equal(one.hsic, two.hsic)
    np.testing.assert_array_equal(one.matrix("b", "a"), one.matrix("a", "b").T)
    text = json.dumps(one.to_dict(), allow_nan=False)
    back = Atlas.from_dict(json.loads(text))
    assert back.to_dict() == one.to_dict()
    np.testing.assert_array_equal(back.matrix("a", "b"), one.matrix("a", "b"))
    low, high = back.interval("a", "b")  # type: ignore[misc]
    assert np.all(low <= high)
    assert one.diagnostics["interval"]["unit"] == "images" and one.diagnostics["bootstrap"] is None


def test_gram_cache_skips_the_forward_pass(images: torch.Tensor, tmp_path: Path) -> None:
    a, b = mixer(0), gmlp(1)
    cache = DirectoryGramCache(tmp_path)
    keys = {"a": "sha-a", "b": "sha-b"}
    first = compare({"a": a}, images, batch_size=32, gram_cache=cache, model_keys=keys)
    ca, cb = count_forwards(a), count_forwards(b)
    both = compare({"a": a, "b": b}, images, batch_size=32, gram_cache=cache, model_keys=keys)
    assert ca[0] == 0 and cb[0] == 3
    # per batch: a's Grams read back, b run; the a-a block reused, a-b and b-b computed
    assert both.diagnostics["gram_cache"] == {
        "mode": "on",
        "hits": 3,
        "misses": 3,
        "blocks_reused": 3,
        "blocks_computed": 6,
    }
    np.testing.assert_array_equal(both.matrix("a"), first.matrix("a"))
    # the same atlas again, models in the other order: every block is stored, nothing runs
    again = compare({"b": b, "a": a}, images, batch_size=32, gram_cache=cache, model_keys=keys)
    assert ca[0] == 0 and cb[0] == 3
    assert again.diagnostics["gram_cache"]["blocks_computed"] == 0
    np.testing.assert_array_equal(again.matrix("a", "b"), both.matrix("a", "b"))
    np.testing.assert_array_equal(again.matrix("b"), both.matrix("b"))
    # without the store: the same numbers (pairs may be multiplied in the other order)
    fresh = compare({"a": a, "b": b}, images, batch_size=32)
    np.testing.assert_allclose(both.hsic, fresh.hsic, rtol=1e-12, atol=0)
    # another plan is another key
    compare({"a": a}, images, batch_size=16, gram_cache=cache, model_keys=keys)
    assert ca[0] == 3 + 5  # the uncached run above, then 5 batches of 16


def test_data_forms_agree(images: torch.Tensor) -> None:
    a = mixer(0)
    base = compare({"a": a}, images, batch_size=32)
    ds = ImageDataset(name="x", x=images.numpy().copy())
    loader = DataLoader(TensorDataset(images, torch.zeros(70)), batch_size=32)
    for data in (ds, images.numpy(), loader):
        np.testing.assert_array_equal(compare({"a": a}, data, batch_size=32).hsic, base.hsic)


def test_cancel_between_batches(images: torch.Tensor) -> None:
    seen: list[tuple[int, int]] = []

    def stop_after_two(done: int, total: int) -> bool:
        seen.append((done, total))
        return done < 2

    with pytest.raises(Cancelled):
        compare({"a": mixer(0)}, images, batch_size=16, on_batch=stop_after_two)
    assert seen == [(1, 5), (2, 5)]


def test_bf16_autocast_is_close(images: torch.Tensor) -> None:
    a = mixer(0)
    fp32 = compare({"a": a}, images, batch_size=35, layers="blocks.*")
    bf16 = compare({"a": a}, images, batch_size=35, layers="blocks.*", dtype="bf16")
    assert bf16.config["dtype"] == "bfloat16"
    np.testing.assert_allclose(bf16.matrix("a"), fp32.matrix("a"), atol=0.05)


def test_mean_tokens_and_full_mode(images: torch.Tensor, ref: types.SimpleNamespace) -> None:
    a = mixer(0)
    atlas = compare(
        {"a": a}, images, layers=["blocks.0", "blocks.2"], feature="mean_tokens", mode="full"
    )
    assert atlas.diagnostics["batches"] == 1
    feats = [
        f.reshape(70, 4 * 4, 32).mean(1)
        for f in activations(a, images, ["blocks.0", "blocks.2"])[:2]
    ]
    np.testing.assert_allclose(atlas.matrix("a"), ref.cka_matrix(feats, feats), atol=1e-9)
