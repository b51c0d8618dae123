"""Training steps on a GPU captured once as a CUDA graph and replayed, so that small models are
not bound by kernel launches.

One step of :func:`models.train` — forward, loss, backward, optimizer step — is a few hundred
kernels; the presets' are so small that on a GPU the host's launches take longer than the
work (BENCHMARKS: 35 ms a step on the host for 2.3 ms of GPU work on an H200, ``mixer_cifar``).
:class:`TrainingStep` runs the steps: on a CUDA device its first :data:`WARMUP_STEPS` full
batches run eagerly on a side stream (as real steps of the training, so the recipe is what
it was), the next is captured with ``torch.cuda.graph`` on static input buffers, and every
later full batch is copied into those buffers and the graph replayed: one launch a step. An
epoch's last, smaller batch runs eagerly. The optimizer is built for it (fused AdamW with
``capturable=True`` and its learning rate a device tensor that the schedule fills in place:
:func:`optimizer`), so the schedule, batch size and optimizer are the recipe's.

Where capture cannot be used the steps run eagerly and :attr:`TrainingStep.reason` says why (a
log line says it too, and the sidecar's ``training.step_capture`` records it): the host (CPU
steps gain nothing from it: BENCHMARKS, "CPU training steps under inductor"), or an
architecture whose step cannot be captured (an operation that reads a value back to the host,
shapes that depend on data), in which case the exception's first line is the reason.
Replays of one graph run the same kernels on the same addresses, so two captured trainings of
one seed are bit-identical as eager ones are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.devices import Placement

__all__ = ["WARMUP_STEPS", "TrainingStep", "optimizer"]

log = logging.getLogger(__name__)

# Eager steps before the capture: the first ones allocate the optimizer's state and let the
# caching allocator and cuBLAS settle their workspaces (PyTorch's "whole network capture").
WARMUP_STEPS = 3
HOST_REASON = "the host runs steps eagerly (a CPU step gains nothing from capture)"

Capture = Callable[[Callable[[], None]], Any]  # records a step, returns what replays it


def optimizer(model: nn.Module, lr: float, weight_decay: float, place: Placement) -> Any:
    """AdamW as timm builds it (no weight decay on biases and gains): on a GPU fused, one kernel
    per step, capturable, its learning rate a device tensor the schedule fills in place; the
    host keeps PyTorch's default, whose steps earlier checkpoints were trained with."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    if not place.is_cuda:
        return torch.optim.AdamW(groups, lr=lr)
    rate = torch.tensor(lr, dtype=torch.float32, device=place.device)
    return torch.optim.AdamW(groups, lr=rate, fused=True, capturable=True)


def cuda_graph(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``step`` recorded as a CUDA graph (its kernels are not run now)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


class TrainingStep:
    """One optimizer step per call, eager or replayed (see the module docstring).

    ``capture``: how a step is recorded (default :func:`cuda_graph` on a CUDA device; None
    runs every step eagerly). A test hands it a recorder that fails, to see the fallback.
    """

    def __init__(
        self,
        model: nn.Module,
        optim: Any,
        place: Placement,
        batch_size: int,
        capture: Capture | None = None,
    ) -> None:
        self.model, self.optim, self.place, self.batch_size = model, optim, place, batch_size
        self.capture = capture if capture is not None else (cuda_graph if place.is_cuda else None)
        self.reason: str | None = None if self.capture is not None else HOST_REASON
        self.graph: Any = None
        self.full_steps = 0  # eager steps of a full batch so far
        self.static: dict[str, torch.Tensor] = {}
        self.stream = torch.cuda.Stream(place.device) if place.is_cuda else None  # type: ignore[no-untyped-call]

    @property
    def record(self) -> str:
        """What the sidecar says: ``cuda_graph``, or ``eager: <why>``."""
        if self.graph is not None:
            return "cuda_graph"
        return f"eager: {self.reason or 'the run ended before the capture'}"

    def _autocast(self) -> Any:
        if self.place.precision == "bf16":  # a captured step may not reuse autocast's cache
            return torch.autocast(self.place.device.type, dtype=torch.bfloat16, cache_enabled=False)
        return self.place.autocast()

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            logits = self.model(x)
            loss = F.cross_entropy(logits, y)
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        self.optim.step()
        return loss, logits

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on the batch (x, y), already on the device: (loss, logits)."""
        full = len(x) == self.batch_size
        if self.graph is not None and full:
            self.static["x"].copy_(x, non_blocking=True)
            self.static["y"].copy_(y, non_blocking=True)
            self.graph.replay()
            return self.static["loss"], self.static["logits"]
        if self.reason is not None or not full:
            return self._eager(x, y)
        if self.full_steps < WARMUP_STEPS:
            self.full_steps += 1
            return self._side_stream(x, y)
        return self._capture(x, y)

    def _side_stream(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An eager step on a side stream, as a capture's warm-up must be."""
        if self.stream is None:
            return self._eager(x, y)
        self.stream.wait_stream(torch.cuda.current_stream(self.place.device))
        with torch.cuda.stream(self.stream):
            out = self._eager(x, y)
        torch.cuda.current_stream(self.place.device).wait_stream(self.stream)
        return out

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the step on static buffers, then replay it for this batch; on failure say why
        and run this batch and the rest eagerly."""
        assert self.capture is not None
        self.static = {"x": x.clone(), "y": y.clone()}

        def step() -> None:
            loss, logits = self._eager(self.static["x"], self.static["y"])
            self.static["loss"], self.static["logits"] = loss, logits

        self.optim.zero_grad(set_to_none=True)
        try:
            graph = self.capture(step)
        except Exception as exc:  # any op the capture refuses: the steps stay eager
            text = str(exc).strip().splitlines()
            self.reason = f"capture failed: {text[0] if text else type(exc).__name__}"
            log.info("training steps run eagerly: %s", self.reason)
            self.static = {}
            self.optim.zero_grad(set_to_none=True)
            return self._eager(x, y)
        self.graph = graph
        log.info("training steps are replayed from a CUDA graph")
        graph.replay()
        return self.static["loss"], self.static["logits"]
