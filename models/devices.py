"""Where a training runs: its device and precision, checked once, and what its checkpoint records.

:func:`placement` turns the ``device`` and ``precision`` of :func:`models.train` into a
:class:`Placement`, or refuses them with a :class:`ConfigError` of one sentence:

``device``
    None or ``"cpu"``: the host (the library never guesses a GPU; the service passes its
    worker's ``CKA_DEVICE``); ``"cuda"``: the current CUDA device; ``"cuda:k"``: that one.
    A CUDA device must exist where the training runs.
``precision``
    ``"fp32"``; or ``"bf16"``: the forward pass and the loss run under ``torch.autocast`` to
    bfloat16 on the device (weights, gradients and optimizer state stay float32, so no loss
    scaling is needed). On a CPU it runs too (autocast on the CPU), fast only where the
    processor has bfloat16 instructions (AMX, AVX512-BF16); a GPU without bfloat16 is refused.

:func:`deterministic_algorithms` holds a run to PyTorch's deterministic algorithms, and
:func:`provenance` is the ``training`` record's part that says where and how a checkpoint was
made: seed, device and its name, torch / CUDA / cuDNN versions, precision, whether
deterministic algorithms were on, the cuBLAS workspace setting and the float32 matmul precision.

What is bit-reproducible: the same seed, data and hyper-parameters give the same weights (the
same sha256) on the same device type *and model* with the same torch (and CUDA, cuDNN) versions —
CPU to CPU with the same torch thread count (the record's ``torch_threads``: a CPU reduction
is split by thread), or one GPU model to another card of that model. A CPU and a GPU, two GPU
models, another thread count or two torch versions give different weights of the same quality:
reductions run in another order.
The minibatch order comes from a CPU generator, so it never depends on the device.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import torch

from models.errors import ConfigError

__all__ = [
    "CUBLAS_WORKSPACE",
    "PRECISIONS",
    "Placement",
    "Precision",
    "deterministic_algorithms",
    "placement",
    "provenance",
]

Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16")
# cuBLAS's documented setting for reproducible results (NVIDIA's cuBLAS guide, "Results
# reproducibility"); torch >= 2.10 gives each handle and stream a workspace of its own and no
# longer needs it, older releases refuse deterministic matmuls on CUDA without it.
CUBLAS_WORKSPACE = ":4096:8"


@dataclass(frozen=True)
class Placement:
    """A checked device (``cuda`` resolved to its index) and precision."""

    device: torch.device
    precision: Precision

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self) -> AbstractContextManager[Any]:
        """The forward pass's context: bfloat16 autocast on the device, or nothing for fp32."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def device_name(self) -> str:
        """The GPU's model (``NVIDIA H100 80GB HBM3``) or the host processor's."""
        if self.is_cuda:
            return str(torch.cuda.get_device_name(self.device))
        return _cpu_name()


@cache
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {str(device)!r}: use 'cpu', 'cuda' or 'cuda:<index>'")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        built = (
            f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        )
        raise ConfigError(
            f"device {str(device)!r} was asked for, but torch {torch.__version__} ({built}) "
            "sees no CUDA device on this machine: train on 'cpu'"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= count:
        seen = ", ".join(f"cuda:{i}" for i in range(count))
        raise ConfigError(
            f"device {str(device)!r} does not exist: torch sees {count} CUDA "
            f"device{'s' if count != 1 else ''} ({seen})"
        )
    return torch.device("cuda", index)


def placement(device: str | torch.device | None = None, precision: str = "fp32") -> Placement:
    """The checked ``device`` and ``precision`` of a training (see the module docstring)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be 'fp32' or 'bf16', not {precision!r}")
    dev = _device(device)
    if precision == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precision 'bf16' needs a GPU with bfloat16 support, and {dev} "
            f"({torch.cuda.get_device_name(dev)}) has none: use 'fp32'"
        )
    return Placement(dev, "bf16" if precision == "bf16" else "fp32")


@contextmanager
def deterministic_algorithms(place: Placement) -> Iterator[None]:
    """PyTorch's deterministic algorithms (and no cuDNN benchmarking) for the block, as before
    after it. On CUDA, ``CUBLAS_WORKSPACE_CONFIG`` is set to :data:`CUBLAS_WORKSPACE` when
    unset (cuBLAS reads it when a handle is made, so in a process that has made none yet)."""
    if place.is_cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    fill: Any = torch.utils.deterministic  # a module whose attribute typeshed does not know
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        fill.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # By default deterministic mode also writes NaN into every new uninitialised tensor, to
    # catch reads of memory no kernel wrote; training never reads such memory, and on a GPU
    # those fills were a seventh of a small model's kernel launches (BENCHMARKS, GPU host).
    fill.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0])
        torch.backends.cudnn.benchmark = previous[1]
        fill.fill_uninitialized_memory = previous[2]


def _cudnn_version() -> int | None:
    version = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    return None if version is None else int(version)


def provenance(place: Placement, *, seed: int, deterministic: bool) -> dict[str, Any]:
    """Where and how a training ran, for its checkpoint's ``training`` record."""
    cuda = place.is_cuda
    return {
        "seed": seed,
        "device": str(place.device),
        "device_name": place.device_name(),
        "precision": place.precision,
        "deterministic": deterministic,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        "cudnn_version": _cudnn_version() if cuda else None,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG") if cuda else None,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
