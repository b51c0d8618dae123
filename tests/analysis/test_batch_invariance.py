"""A cell's company does not depend on the batch size (issue 24): intervals and sensitivity.

The batch size is a memory knob: on the same images, the interval of a cell must be about as
wide at any batch count, and the sensitivity (CKA without a layer's top principal direction)
must remove the direction of the whole sample, not of each batch.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch import nn

from analysis import OptionsError, compare, load_dataset

LAYERS = ["1", "3", "5"]


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 48),
        nn.ReLU(),
        nn.Linear(48, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


@pytest.fixture(scope="module")
def pair() -> dict[str, nn.Module]:
    """Two networks trained on the digits train split from different seeds."""
    train = load_dataset("digits", split="train")
    x, y = torch.from_numpy(train.x), torch.from_numpy(train.y)
    nets = {}
    for name, seed in (("a", 0), ("b", 1)):
        net = _net(seed)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(300):
            idx = torch.randint(0, len(x), (64,), generator=gen)
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        nets[name] = net.eval()
    return nets


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    """The digits test split: 450 images, so batches of 50 make 9, of 150 make 3."""
    return torch.from_numpy(load_dataset("digits", split="test").x)


def _widths(atlas: object) -> np.ndarray:
    low, high = atlas.interval("a", "b")  # type: ignore[attr-defined]
    return np.asarray(high - low)


def test_interval_width_does_not_depend_on_the_batch_size(
    pair: dict[str, nn.Module], images: torch.Tensor
) -> None:
    kw = {"layers": LAYERS, "bootstrap": 200, "seed": 0, "device": "cpu"}
    w50 = _widths(compare(pair, images, batch_size=50, **kw))
    w150 = _widths(compare(pair, images, batch_size=150, **kw))
    assert np.all(w50 > 0) and np.all(w150 > 0)
    ratio = float(np.median(w150 / w50))
    assert abs(ratio - 1) <= 0.2, f"intervals at batch 150 are {ratio:.2f} × those at batch 50"


def _features(net: nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """The selected layers' outputs, read with forward hooks (no engine code)."""
    out: dict[str, np.ndarray] = {}
    hooks = [
        dict(net.named_modules())[name].register_forward_hook(
            lambda _m, _i, o, name=name: out.__setitem__(name, o.detach().double().numpy())
        )
        for name in LAYERS
    ]
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    return [out[name] for name in LAYERS]


def _deflated_cka(
    xs: list[np.ndarray], ys: list[np.ndarray], batch: int, ref: types.SimpleNamespace
) -> np.ndarray:
    """CKA (rows: xs without their whole-sample top direction, columns: ys intact), by batch."""
    tops = []
    for x in xs:
        xc = x - x.mean(0)
        tops.append(np.linalg.svd(xc, full_matrices=False)[2][0])  # one SVD of the whole sample
    n = len(xs[0])
    cross = np.zeros((len(xs), len(ys)))
    own = np.zeros(len(xs))
    intact = np.zeros(len(ys))
    for s in ref.batches(n, batch, "unbiased"):
        ks = [
            ref.gram(x[s] - np.outer(x[s] @ w, w), "linear") for x, w in zip(xs, tops, strict=True)
        ]
        ls = [ref.gram(y[s], "linear") for y in ys]
        for i, k in enumerate(ks):
            own[i] += ref.hsic(k, k, "unbiased")
            for j, l in enumerate(ls):  # noqa: E741
                cross[i, j] += ref.hsic(k, l, "unbiased")
        for j, l in enumerate(ls):  # noqa: E741
            intact[j] += ref.hsic(l, l, "unbiased")
    return cross / np.sqrt(np.outer(own, intact))


# 450 samples: every layer (48, 32, 10 wide) has more samples than features; 40: the first has
# fewer (its direction comes from the samples' Gram XXᵀ, the others' from XᵀX)
@pytest.mark.parametrize(("n", "batch"), [(450, 50), (450, 450), (40, 10), (40, 40)])
def test_sensitivity_removes_the_whole_samples_top_direction(
    pair: dict[str, nn.Module],
    images: torch.Tensor,
    n: int,
    batch: int,
    ref: types.SimpleNamespace,
) -> None:
    images = images[:n]
    atlas = compare(pair, images, layers=LAYERS, batch_size=batch, sensitivity=True, device="cpu")
    drop = atlas.without_top_pc("a", "b")
    assert drop is not None
    xs, ys = _features(pair["a"], images), _features(pair["b"], images)
    np.testing.assert_allclose(drop[0], _deflated_cka(xs, ys, batch, ref), rtol=0, atol=1e-6)
    np.testing.assert_allclose(drop[1], _deflated_cka(ys, xs, batch, ref).T, rtol=0, atol=1e-6)


def test_the_batch_bootstrap_refuses_fewer_than_20_batches(
    pair: dict[str, nn.Module], images: torch.Tensor
) -> None:
    kw = {"layers": LAYERS, "bootstrap": 100, "interval": "batches", "device": "cpu"}
    with pytest.raises(OptionsError, match=r"^interval: a bootstrap over 9 batches") as info:
        compare(pair, images, batch_size=50, **kw)
    assert info.value.field == "interval" and info.value.kind == "too_few_batches"
    atlas = compare(pair, images, batch_size=20, **kw)  # 23 batches (the last of 10): allowed
    assert atlas.interval("a", "b") is not None
    assert atlas.diagnostics["interval"]["unit"] == "batches"
