"""KeptFeatures: each layer's batches, in order, in one buffer per layer."""

from __future__ import annotations

import torch

from analysis.batch_statistics.kept import KeptFeatures


def _batches(sizes: list[int], shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, *shape, generator=gen) for b in sizes]


def test_layers_hold_every_batch_in_order_flattened() -> None:
    sizes = [5, 5, 3]  # the plan's last batch is short
    a, b = _batches(sizes, (2, 3), 0), _batches(sizes, (4,), 1)
    kept = KeptFeatures(2, batches=3, device=torch.device("cpu"))
    for x, y in zip(a, b, strict=True):
        kept.add(0, x)
        kept.add(1, y)
        assert torch.equal(kept.last(0, len(x)), x.reshape(len(x), -1))
    first, second = kept.layers()
    assert torch.equal(first, torch.cat(a).reshape(13, 6))
    assert torch.equal(second, torch.cat(b))
    assert kept.sizes == sizes
    assert kept.buffers[0] is not None and kept.buffers[0].shape == (15, 6)  # sized once


def test_more_batches_than_planned_grow_the_buffer() -> None:
    sizes = [2, 4, 4, 4]  # a plan of one batch, and later batches larger than the first
    a = _batches(sizes, (3,), 2)
    kept = KeptFeatures(1, batches=1, device=torch.device("cpu"))
    for x in a:
        kept.add(0, x)
    assert torch.equal(kept.layers()[0], torch.cat(a))
    assert kept.sizes == sizes


def test_an_unused_layer_is_empty() -> None:
    kept = KeptFeatures(2, batches=None, device=torch.device("cpu"))
    kept.add(0, torch.ones(3, 2))
    assert kept.layers()[1].shape == (0, 0)
