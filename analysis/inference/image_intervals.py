"""Intervals per cell with the image as the unit, whatever the batch size: the Hoeffding projection.

**Why not resample batches.** A minibatch atlas sums per-batch HSIC terms, so a bootstrap over
batches (:mod:`analysis.inference.bootstrap`) sees as many units as there are batches: with 3
batches it has 10 distinct resamples and its percentiles mean little. The unit of sampling is the
image: the images are the draws from the population, and a batch is a memory knob. Resampling images
inside each batch's Grams would cost one HSIC product per replicate and batch; the first-order
(Hoeffding) projection of the U-statistic gives the same variance from one pass, for every
cell at once, at the cost of one more batched product the size of the HSIC product.

**The projection.** Each batch's HSIC is a U-statistic of order 4 in its n images (biased: a
V-statistic, the same to first order), so ``U - θ ≈ (4/n) Σ_a (h₁(a) - θ)`` with h₁ the
kernel's mean given one image. For HSIC, ``h₁(a) - θ = (g(a) - θ) / 2`` with
``g(a) = E[k̄(a, ·) l̄(a, ·)]`` (k̄, l̄ the doubly centred kernels), whose plug-in is the row
product ``t_a = Σ_c K̃_ac L̃_ac`` of the batch's centred Grams (diagonal zeroed for the
unbiased estimator) times the estimator's normalisation c (``1/(n(n-3))`` unbiased,
``1/(n-1)²`` biased), since ``Σ_a t_a = tr(K̃L̃)`` is the estimator's leading term. So image a
contributes ``ψ_a = 2c (t_a - t̄)`` to its batch's HSIC; the batches are disjoint, so the
minibatch HSIC of a cell has variance ``Σ_a ψ_a²`` (each batch's sum scaled by n/(n-1)), and
the per-image terms of every pair of layers come from one batched product of the rows
``F[:, a, :]`` the engine already has (:func:`analysis.estimators.hsic.centred_rows`).

**CKA.** ρ = H_xy / sqrt(H_xx H_yy); the delta method gives each image's contribution
``φ_a = ψ_xy/sqrt(H_xx H_yy) - ρ/2 (ψ_xx/H_xx + ψ_yy/H_yy)``, so Var(ρ) needs only the sums
``A = Σ ψ_xy²``, ``B = Σ ψ_xy ψ_xx`` and ``C = Σ ψ_xx ψ_yy`` per cell: sums over images, so a
comparison split into ranges of batches adds them up (:mod:`analysis.shards.shard`). The interval is
``ρ ± z·sd`` (Wald, 95 %: z = 1.96), NaN where the cell is undefined; a layer against itself
has width 0. Validated by coverage on trained digits networks at batch sizes 50 and 150
(``bench/bench_intervals.py``, BENCHMARKS.md). The projection leaves out the second-order
(degenerate) term, whose share grows as a cell nears independence (CKA ≈ 0) in small batches.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import torch

from analysis.estimators.hsic import cka_from_hsic

__all__ = ["MOMENTS", "ImageMoments", "image_intervals", "sample_terms"]

MOMENTS = ("A", "B", "C")
# A variance this small against its own positive terms is rounding of an exact 0.
_CANCELLED = 1e-10


def sample_terms(rows: tuple[torch.Tensor, torch.Tensor], estimator: str) -> torch.Tensor:
    """Each image's contribution ψ (n, L, L) to its batch's HSIC of every pair of layers.

    ``rows``: :func:`analysis.estimators.hsic.centred_rows` of the batch's stacked Grams. Sums to 0
    over the batch.
    """
    f, r = rows
    n_layers, n = r.shape
    per = f.view(n_layers, n, n).transpose(0, 1)  # (n, L, n): every layer's row of image a
    t = torch.bmm(per, per.transpose(1, 2))  # t[a, i, j] = Σ_c K̃_i[a, c] K̃_j[a, c]
    c = 1 / (n * (n - 3)) if estimator == "unbiased" else 1 / (n - 1) ** 2
    return 2 * c * (t - t.mean(0))


class ImageMoments:
    """Sums over images of the products of their terms ψ that the delta method needs."""

    def __init__(self, n_layers: int, device: torch.device) -> None:
        self.sums = {
            k: torch.zeros(n_layers, n_layers, dtype=torch.float64, device=device) for k in MOMENTS
        }

    def add(self, rows: tuple[torch.Tensor, torch.Tensor], estimator: str) -> None:
        """One batch, given as its :func:`analysis.estimators.hsic.centred_rows`."""
        self.add_terms(sample_terms(rows, estimator))

    def add_terms(self, psi: torch.Tensor) -> None:
        """One batch, given as its images' terms (:func:`sample_terms`)."""
        n = psi.shape[0]
        scale = n / (n - 1)  # the batch's ψ are centred on their own mean
        diag = psi.diagonal(dim1=1, dim2=2)  # (n, L): ψ of each layer with itself
        self.sums["A"] += scale * psi.square().sum(0)
        self.sums["B"] += scale * torch.einsum("aij,ai->ij", psi, diag)
        self.sums["C"] += scale * diag.T @ diag

    def state(self) -> dict[str, np.ndarray]:
        """The sums as float64 arrays; the states of disjoint batches add up."""
        return {k: v.cpu().numpy().copy() for k, v in self.sums.items()}


def image_intervals(
    hsic: np.ndarray, moments: dict[str, np.ndarray], level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) (L, L): ``ρ ± z·sd`` from the summed HSIC and :class:`ImageMoments` sums."""
    rho = cka_from_hsic(hsic)
    d = np.diag(hsic)
    a, b, c = (np.asarray(moments[k], dtype=np.float64) for k in MOMENTS)
    with np.errstate(divide="ignore", invalid="ignore"):
        dd = np.outer(d, d)
        cd = np.diag(c) / d**2
        plus = a / dd + rho**2 / 4 * (cd[:, None] + cd[None, :] + 2 * c / dd)
        var = plus - rho / np.sqrt(dd) * (b / d[:, None] + b.T / d[None, :])
        # a layer against itself (or an identical one) cancels to 0 up to rounding: call it 0
        var[var <= _CANCELLED * np.abs(plus)] = 0.0
        half = NormalDist().inv_cdf(0.5 + level / 2) * np.sqrt(var)
    low, high = rho - half, rho + half
    bad = ~np.isfinite(rho) | ~np.isfinite(half)
    low[bad] = np.nan
    high[bad] = np.nan
    return low, high
