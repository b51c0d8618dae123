"""Training steps captured and replayed (models.step_capture), checked on the host: a recorder
that replays the step it recorded stands in for a CUDA graph, one that fails for an
architecture whose step cannot be captured. The CUDA runs are in test_devices.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from models import create
from models.devices import placement
from models.step_capture import HOST_REASON, WARMUP_STEPS, TrainingStep, optimizer

BATCH = 16


class ReplayedStep:
    """What a CUDA graph does, on the host: recording runs nothing, a replay runs the step
    on the buffers it was recorded with."""

    def __init__(self, step: Callable[[], None]) -> None:
        self.step, self.replays = step, 0

    def replay(self) -> None:
        self.replays += 1
        self.step()


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Eight full batches and a smaller one, as an epoch ends."""
    gen = torch.Generator().manual_seed(0)
    sizes = [BATCH] * 8 + [5]
    return [
        (torch.rand(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen))
        for n in sizes
    ]


def _train(capture: Any) -> tuple[list[torch.Tensor], TrainingStep, list[float]]:
    torch.manual_seed(0)
    model = create("mlp_digits")
    place = placement("cpu")
    step = TrainingStep(model, optimizer(model, 1e-3, 0.05, place), place, BATCH, capture=capture)
    losses = [float(step(x, y)[0].detach()) for x, y in _batches()]
    return [p.detach().clone() for p in model.parameters()], step, losses


def test_replayed_steps_train_exactly_as_eager_ones() -> None:
    eager, plain, eager_losses = _train(None)
    graphs: list[ReplayedStep] = []

    def record(step: Callable[[], None]) -> ReplayedStep:
        graphs.append(ReplayedStep(step))
        return graphs[-1]

    replayed, captured, losses = _train(record)
    assert plain.record == f"eager: {HOST_REASON}"
    assert captured.record == "cuda_graph" and len(graphs) == 1
    # warm-up steps eager, then every full batch replayed (the capture's own batch too); the
    # last, smaller batch eager
    assert graphs[0].replays == 8 - WARMUP_STEPS
    assert losses == eager_losses
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager, strict=True))


def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eager, _, eager_losses = _train(None)

    def refuse(step: Callable[[], None]) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    with caplog.at_level("INFO", logger="models.step_capture"):
        fallen, step, losses = _train(refuse)
    assert step.record == "eager: capture failed: operation not permitted when stream is capturing"
    assert "training steps run eagerly: capture failed" in caplog.text
    assert losses == eager_losses
    assert all(torch.equal(a, b) for a, b in zip(fallen, eager, strict=True))
