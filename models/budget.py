"""What a model would cost before it is built: parameters and memory for a batch, from a meta build.

A request names an architecture and options; before it is queued, :func:`check_budget` builds
the model on the meta device (no memory is allocated), counts its parameters and buffers, and
runs one meta forward pass over a batch to add up the activations every layer produces::

    models.estimate("mixer_cifar", {"embed_dim": 512}, batch_size=64).bytes(training=True)
    models.check_budget("mixer_cifar", {"embed_dim": 512}, batch_size=64,
                        max_bytes=16 << 30, training=True)   # or a ConfigError

The estimate is what a float32 run keeps at its peak: the weights (with their gradients and
AdamW's two moments when training) and buffers, plus every layer's output for the batch (kept
for the backward pass when training; an upper bound of what inference holds at once).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from models.connections import input_spec
from models.errors import ConfigError
from models.factory import create
from models.families import family_of
from models.options import shape_config, validate_config

__all__ = ["Budget", "check_budget", "estimate"]

# Copies of each weight a training step keeps: the weight, its gradient, AdamW's two moments.
_TRAINING_COPIES = 4


@dataclass(frozen=True)
class Budget:
    """Sizes of one model at one batch size (``activation_bytes``: None if no meta forward runs)."""

    arch: str
    batch_size: int
    parameters: int
    parameter_bytes: int
    buffer_bytes: int
    activation_bytes: int | None

    def bytes(self, *, training: bool) -> int:
        """Peak memory of a forward pass (``training``: and its backward and optimizer step)."""
        weights = self.parameter_bytes * (_TRAINING_COPIES if training else 1)
        return weights + self.buffer_bytes + (self.activation_bytes or 0)


def _activation_bytes(model: nn.Module, shape: tuple[int, ...]) -> int | None:
    total = 0

    def count(_module: nn.Module, _inputs: Any, output: Any) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            model(torch.empty(shape, device="meta"))
    except (
        NotImplementedError,
        RuntimeError,
        ValueError,
        TypeError,
        AssertionError,
        IndexError,
        KeyError,
        AttributeError,
    ):
        return None  # a timm forward without meta kernels or checks: the weights alone count
    finally:
        for handle in handles:
            handle.remove()
    return total


@lru_cache(maxsize=256)
def _estimate(arch: str, config_json: str, batch_size: int) -> Budget:
    config = json.loads(config_json)
    try:
        with torch.device("meta"):
            model = create(arch, **config)
    except (NotImplementedError, RuntimeError) as exc:
        raise ConfigError(f"{arch} cannot be sized without building it ({exc})") from None
    spec = input_spec(model)
    return Budget(
        arch=arch,
        batch_size=batch_size,
        parameters=sum(p.numel() for p in model.parameters()),
        parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        activation_bytes=_activation_bytes(model.eval(), (batch_size, *spec.shape)),
    )


def estimate(arch: str, config: Mapping[str, Any] | None = None, *, batch_size: int) -> Budget:
    """Parameters and memory of ``arch`` under ``config`` for batches of ``batch_size``.

    A preset's options are validated first (each has a maximum), so an absurd option fails
    with its own sentence before anything is built.
    """
    if batch_size < 1:
        raise ConfigError(f"a batch size must be at least 1, not {batch_size}")
    full = validate_config(arch, config) if family_of(arch) is not None else dict(config or {})
    return _estimate(arch, json.dumps(shape_config(full), sort_keys=True), batch_size)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_budget(
    arch: str,
    config: Mapping[str, Any] | None = None,
    *,
    batch_size: int,
    max_bytes: int,
    training: bool,
) -> Budget:
    """:func:`estimate`, or a ConfigError when it needs more than ``max_bytes``."""
    budget = estimate(arch, config, batch_size=batch_size)
    need = budget.bytes(training=training)
    if need > max_bytes:
        what = "train" if training else "run"
        raise ConfigError(
            f"{arch} with these options has {budget.parameters:,} parameters and needs about "
            f"{_gib(need)} to {what} at batch size {batch_size}, more than the "
            f"{_gib(max_bytes)} allowed; choose smaller options or a smaller batch"
        )
    return budget
