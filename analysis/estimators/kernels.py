"""Kernels that turn a batch of feature vectors into a Gram matrix.

Both kernels return the *raw* Gram of the batch; centring happens later, in float64, in
:mod:`analysis.estimators.hsic`. Features are first shifted by the batch's first sample, ``x_i -
x_0``. Neither kernel's centred Gram changes under a common shift of the features (the linear Gram
changes by ``a 1ᵀ + 1 aᵀ + c``, which double centring removes; distances do not change at
all), but the shift removes a large common mean before the fp32 product, and it makes the
Gram of a constant layer exactly zero, so a degenerate layer is recognised exactly rather
than through rounding noise.

Kernels, for rows ``x_i`` of the shifted batch:

* ``linear``: ``K_ij = x_i · x_j``.
* ``rbf``: ``K_ij = exp(-‖x_i - x_j‖² / (2 σ²))`` with ``σ² = t² · m`` and ``m`` the median of
  the off-diagonal squared distances ``{‖x_i - x_j‖² : i < j}`` of the batch (the mean of the
  two middle values when their count is even), ``t = 1`` by default; so ``σ = t·sqrt(m)``,
  as in Kornblith et al. 2019 except that the zero diagonal is left out of the median. The
  bandwidth therefore depends on the batch (in ``full`` mode: on the whole sample). When
  ``m = 0`` (more than half the pairs coincide) the kernel is the limit ``K_ij = [x_i = x_j]``.
  Written ``"rbf"`` or ``"rbf:T"`` (e.g. ``"rbf:0.5"``) to choose ``t``, from
  :data:`RBF_T_MIN` to :data:`RBF_T_MAX`.

Why ``t`` is bounded. The kernel is ``exp(d / (-2 t² m))`` in the features' dtype (float32
for a forward pass's activations, float64 where features are kept so). At the median pair
(``d = m``) that is ``exp(-1 / (2 t²))``:

* small ``t``: float32 underflows below ``exp(-87.3)`` (denormals) and to 0 below
  ``exp(-103.9)``; at ``t = 0.1`` the median pair is ``exp(-50) ≈ 2e-22``, a normal float32,
  and so is every pair whose squared distance is up to 1.7 times the median; at
  ``t = 1e-30`` the factor ``2 t² m`` itself is 0 in float32 and the diagonal becomes 0/0
  (every cell NaN);
* large ``t``: ``1 - K ≈ d / (2 t² m)`` is what the kernel says, and float32 keeps it to
  ``6e-8 × 2 t²`` relative: ``1e-5`` at ``t = 10``, ``1e-3`` at 100, nothing at ``1e4``;
  ``t²`` is infinite in float64 from ``1.3e154`` (``rbf:1e308`` raised OverflowError).

Within [0.1, 10] the factor ``2 t²`` is from 0.02 to 200, so ``2 t² m`` neither vanishes nor
overflows unless the median squared distance ``m`` is itself at the edge of float32's range,
and the kernel already spans from nearly the identity to nearly linear CKA.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from analysis.errors import EstimatorError, did_you_mean

__all__ = ["KERNELS", "RBF_T_MAX", "RBF_T_MIN", "Kernel", "KernelName", "gram", "parse_kernel"]

KernelName = Literal["linear", "rbf"]
KERNELS: tuple[KernelName, ...] = get_args(KernelName)
# The bandwidth multipliers ``rbf:T`` takes: where float32 holds the kernel (module docstring).
RBF_T_MIN, RBF_T_MAX = 0.1, 10.0


@dataclass(frozen=True)
class Kernel:
    """A kernel and, for ``rbf``, its bandwidth multiplier ``t``."""

    name: str = "linear"
    threshold: float = 1.0

    @property
    def spec(self) -> str:
        """The canonical string form, which :func:`parse_kernel` reads back."""
        if self.name == "rbf" and self.threshold != 1.0:
            return f"rbf:{self.threshold!r}"
        return self.name


def parse_kernel(spec: str | Kernel) -> Kernel:
    """Read ``"linear"``, ``"rbf"`` or ``"rbf:T"``; anything else is an :class:`EstimatorError`."""
    if isinstance(spec, Kernel):
        return spec
    name, _, arg = str(spec).strip().lower().partition(":")
    if name not in KERNELS or (name == "linear" and arg):
        raise EstimatorError(
            f"unknown kernel {spec!r}; use 'linear', 'rbf' or 'rbf:T'{did_you_mean(name, KERNELS)}"
        )
    if not arg:
        return Kernel(name)
    try:
        t = float(arg)
    except ValueError:
        t = float("nan")
    if not RBF_T_MIN <= t <= RBF_T_MAX:  # NaN fails too
        raise EstimatorError(
            f"the rbf bandwidth multiplier T of {str(spec)[:40]!r} must be a number from "
            f"{RBF_T_MIN:g} to {RBF_T_MAX:g} (beyond, float32 cannot hold the kernel)"
        )
    return Kernel(name, t)


def _median(values: torch.Tensor) -> torch.Tensor:
    """Median of a 1-D tensor, averaging the two middle values of an even count (NumPy's)."""
    m = values.numel()
    hi = torch.kthvalue(values, m // 2 + 1).values
    if m % 2:
        return hi
    return (torch.kthvalue(values, m // 2).values + hi) / 2


LOW_PRECISION = (torch.bfloat16, torch.float16)


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype a Gram of features of ``dtype`` is summed and kept in: float32 for bf16 and
    fp16 features (as cuBLAS accumulates them), else their own."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def _mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``a @ b`` into ``out``; low-precision factors summed in ``out``'s float32 (on CUDA by the
    matmul itself, elsewhere from exact float32 copies of the factors)."""
    if a.dtype == out.dtype:
        return torch.mm(a, b, out=out)
    if a.is_cuda:
        try:
            return out.copy_(torch.mm(a, b, out_dtype=out.dtype))
        except (RuntimeError, TypeError, NotImplementedError):  # a torch without mm's out_dtype
            pass
    return torch.mm(a.to(out.dtype), b.to(out.dtype), out=out)


def _xxt(x: torch.Tensor, out: torch.Tensor | None = None, parts: int = 4) -> torch.Tensor:
    """x xᵀ computing only the blocks on and below the diagonal, then mirroring them, summed
    in :func:`accumulator` of ``x``'s dtype (``out``'s, when given).

    Saves (parts - 1) / (2 parts) of the flops of one ``x @ x.T`` (a SYRK that torch does not
    expose), and the result is symmetric bit for bit.
    """
    b = x.shape[0]
    if out is None:
        out = torch.empty(b, b, dtype=accumulator(x.dtype), device=x.device)
    if b < 32 * parts:
        return _mm(x, x.T, out)
    cuts = [b * i // parts for i in range(parts + 1)]
    for lo, hi in itertools.pairwise(cuts):
        _mm(x[lo:], x[lo:hi].T, out[lo:, lo:hi])
    for lo, hi in itertools.pairwise(cuts[:-1]):
        out[lo:hi, hi:].copy_(out[hi:, lo:hi].T)
    return out


def gram(x: torch.Tensor, kernel: Kernel, out: torch.Tensor | None = None) -> torch.Tensor:
    """Raw Gram matrix (b, b) of the rows of ``x`` (b, d), into ``out``: in ``x``'s dtype, or
    float32 for bf16 and fp16 features, whose products are summed in float32
    (:func:`accumulator`).

    Float32 and float64 features are shifted by their first row first (the kernels are
    invariant to it, and the products of large shared offsets cancel less); bf16 and fp16
    features are not, as a shift in their own precision would round them again.
    """
    x = x if x.dtype in LOW_PRECISION else x - x[:1]
    if kernel.name == "linear":
        return _xxt(x, out)
    k = _xxt(x)
    sq = k.diagonal()
    d = (sq[:, None] + sq[None, :] - 2 * k).clamp_(min=0)  # rounding can dip below 0
    d.fill_diagonal_(0)
    b = d.shape[0]
    iu = torch.triu_indices(b, b, 1, device=d.device)
    m = _median(d[iu[0], iu[1]]) if b > 1 else d.new_zeros(())
    # torch.where rather than an `if`: no host-device synchronisation per layer.
    k = torch.where(m > 0, torch.exp(d / (-2.0 * kernel.threshold**2 * m)), (d == 0).to(d.dtype))
    if out is None:
        return k
    return out.copy_(k)
