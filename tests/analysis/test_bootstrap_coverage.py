"""The bootstrap interval of :func:`analysis.compare` against a CKA known in closed form.

Features x ~ N(0, I_3) and y = x A + s ε with ε ~ N(0, I_2). For the linear kernel the
population HSIC is ‖Cov(x, y)‖_F², so the population CKA is

    ‖A‖_F² / (‖I_3‖_F · ‖AᵀA + s² I_2‖_F)

which the unbiased minibatch estimate converges to. Over many independent seeded draws, a 95 %
interval must hold it in most draws, and be about as wide as the estimates actually spread
across draws (an interval of everything would hold it too).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from analysis import compare

A = np.array([[1.0, 0.0], [0.5, 1.0], [0.0, 0.5]])
NOISE = 1.5
DRAWS, BATCHES, BATCH = 40, 20, 32


class Pick(nn.Module):
    """One layer: some channels of the input, as features."""

    def __init__(self, channels: list[int]) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t[:, self.channels, 0, 0]


class XY(nn.Module):
    """A "model" whose two layers are x (channels 0-2) and y (channels 3-4) of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.y = Pick([0, 1, 2]), Pick([3, 4])

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x(t), self.y(t)


@pytest.fixture
def one_thread() -> Iterator[None]:
    # The batches are tiny; on a busy machine, thread hand-offs would cost more than the work.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def population_cka() -> float:
    syy = A.T @ A + NOISE**2 * np.eye(2)
    return float(np.sum(A**2) / (np.linalg.norm(np.eye(3)) * np.linalg.norm(syy)))


@pytest.mark.usefixtures("one_thread")
def test_bootstrap_interval_covers_the_population_cka() -> None:
    truth = population_cka()
    model = XY()
    estimates, lows, highs = [], [], []
    for seed in range(DRAWS):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(BATCHES * BATCH, 3))
        y = x @ A + NOISE * rng.normal(size=(BATCHES * BATCH, 2))
        data = torch.from_numpy(np.concatenate([x, y], 1).astype(np.float32))[:, :, None, None]
        atlas = compare(
            {"m": model},
            data,
            layers=["x", "y"],
            batch_size=BATCH,
            bootstrap=200,
            seed=seed,
            device="cpu",
        )
        interval = atlas.interval("m")
        assert interval is not None
        estimates.append(atlas.matrix("m")[0, 1])
        lows.append(interval[0][0, 1])
        highs.append(interval[1][0, 1])
    low, high = np.array(lows), np.array(highs)
    covered = np.mean((low <= truth) & (truth <= high))
    assert covered >= 0.8, f"the 95 % interval held the true CKA in only {covered:.0%} of draws"
    # A 95 % interval of a roughly normal estimate is about 2 × 1.96 standard deviations wide.
    ratio = np.mean(high - low) / (2 * 1.96 * np.std(estimates))
    assert 0.6 < ratio < 1.6, f"intervals are {ratio:.2f} × the width the estimates' spread gives"
