"""The image noise of a difference of two CKA values computed over the same images.

**Why.** :mod:`analysis.inference.image_intervals` gives each cell's image variance from the
first-order (Hoeffding) projection: a cell's CKA, over a sample of N images, is to first order
``ρ̂ − ρ ≈ Σ_a φ_a`` with ``φ_a`` the projection of image a (its influence), so
``Var(ρ̂) ≈ Σ_a φ_a²``. Two cells computed over the same images — the Mixer against arm A and
the Mixer against arm B, a cell and its untrained twin — are two such sums over *the same*
``a``. Their difference is then ``Σ_a (φ_a − φ'_a)`` to first order, so

    Var(ρ̂ − ρ̂') ≈ Σ_a (φ_a − φ'_a)² = Var(ρ̂) + Var(ρ̂') − 2 Σ_a φ_a φ'_a.

Adding the two variances ("as if independent") counts the shared part ``Σ φ_a φ'_a`` twice;
when the same image moves both cells the same way, which is the rule for two comparisons
against one model, that is most of it. The same holds for any fixed linear combination of
cells (a study's table mean minus another's): project every cell, combine the projections
image by image with the same weights, and sum the squares. This is the projection of a
difference of two U-statistics over one sample (Hoeffding 1948; van der Vaart 1998, §12.1): the
difference is itself a U-statistic with the difference of the kernels, whose first-order
projection is the difference of the projections.

**When the two sides saw different images** the projections cannot be matched image by image;
the two samples are independent and the variance of the difference is the sum
(:func:`unpaired_variance`). Callers say which one they used (``paired`` in their output).

**The terms.** Per batch of n images the engine has the doubly centred Grams; image a's term in
a cell's HSIC is ``ψ_a = 2c (t_a − t̄)`` with ``t_a = Σ_c K̃_ac L̃_ac``
(:func:`analysis.inference.image_intervals.sample_terms`), here multiplied by ``√(n/(n−1))``
so that the sum of squares over a batch carries the same small-sample factor as the
intervals' moments. With the whole plan's HSIC H and ρ, a cell (x, y) projects each image to

    φ_a = ψ_xy,a / √(H_xx H_yy) − ρ/2 (ψ_xx,a / H_xx + ψ_yy,a / H_yy)

(the delta method), so ``Σ_a φ_a²`` is exactly the variance the cell's image interval uses.
A study reads, per pair of models with equal layer counts, the projection of the mean of the
diagonal cells (:func:`pair_projections`), the statistic it tables. A comparison with
baselines keeps every cell's projection for as long as it runs (:func:`cell_projections`), so
a cell's verdicts weigh its difference from its untrained twins or its seed ceiling, computed
over the same images, by the variance of the difference (:mod:`analysis.inference.verdicts`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "DiagonalCells",
    "cell_projections",
    "diagonal_terms",
    "pair_projections",
    "paired_variance",
    "unpaired_variance",
]

# Cells per chunk when forming the per-image terms (memory: n × chunk × n floats).
_CHUNK = 512


class DiagonalCells:
    """The diagonal cells (x, y) of pairs of models with equal layer counts.

    ``pairs``: the model index pairs; ``x``, ``y``: global layer indices of each cell;
    ``pair``: the index in ``pairs`` of the pair each cell belongs to. Made for every pair
    i < j of a comparison's models by :meth:`every_pair`, or for chosen pairs by the constructor.
    """

    def __init__(self, sizes: list[int], pairs: list[tuple[int, int]]) -> None:
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        xs: list[int] = []
        ys: list[int] = []
        owner: list[int] = []
        for k, (i, j) in enumerate(pairs):
            if sizes[i] != sizes[j]:
                raise ValueError(f"models {i} and {j} have {sizes[i]} and {sizes[j]} layers")
            xs.extend(range(offsets[i], offsets[i] + sizes[i]))
            ys.extend(range(offsets[j], offsets[j] + sizes[j]))
            owner.extend([k] * sizes[i])
        self.models = len(sizes)
        self.pairs = list(pairs)
        self.x = np.asarray(xs, dtype=np.int64)
        self.y = np.asarray(ys, dtype=np.int64)
        self.pair = np.asarray(owner, dtype=np.int64)

    @classmethod
    def every_pair(cls, sizes: list[int]) -> DiagonalCells:
        """The cells of every pair i < j of models with equal, non-zero layer counts."""
        m = len(sizes)
        pairs = [
            (i, j) for i in range(m) for j in range(i + 1, m) if sizes[i] == sizes[j] and sizes[i]
        ]
        return cls(sizes, pairs)


def diagonal_terms(
    rows: tuple[torch.Tensor, torch.Tensor], estimator: str, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One batch's per-image terms: (ψ of cells (x[k], y[k]) (n, K), ψ of every layer with
    itself (n, L)), each scaled by √(n/(n−1)) (module docstring); float64 on the host."""
    f, r = rows
    n_layers, n = r.shape
    per = f.view(n_layers, n, n).transpose(0, 1)  # (n, L, n): every layer's row of image a
    c = 1 / (n * (n - 3)) if estimator == "unbiased" else 1 / (n - 1) ** 2
    factor = 2 * c * math.sqrt(n / (n - 1))

    def centred(t: torch.Tensor) -> np.ndarray:
        out: np.ndarray = (factor * (t - t.mean(0))).to(torch.float64).cpu().numpy()
        return out

    own = centred(per.square().sum(2))
    xi = torch.as_tensor(x, device=per.device)
    yi = torch.as_tensor(y, device=per.device)
    parts = [
        centred((per[:, xi[s : s + _CHUNK]] * per[:, yi[s : s + _CHUNK]]).sum(2))
        for s in range(0, len(x), _CHUNK)
    ]
    cells = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
    return cells, own


def pair_projections(
    hsic: np.ndarray, cells: DiagonalCells, psi_cells: np.ndarray, psi_self: np.ndarray
) -> np.ndarray:
    """(N, P): each image's projection φ of the mean diagonal CKA of each of ``cells.pairs``.

    ``hsic``: the whole plan's (L, L) HSIC (only its diagonal and the cells are read);
    ``psi_cells``, ``psi_self``: the batches' :func:`diagonal_terms` stacked over the N images.
    The mean is over the pair's cells whose CKA is defined (as a study averages them); NaN for
    a pair with no defined cell.
    """
    d = np.diag(hsic)
    dx, dy = d[cells.x], d[cells.y]
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = hsic[cells.x, cells.y] / np.sqrt(dx * dy)
        rho[~((dx > 0) & (dy > 0))] = np.nan
        phi = psi_cells / np.sqrt(dx * dy) - rho / 2 * (
            psi_self[:, cells.x] / dx + psi_self[:, cells.y] / dy
        )
    ok = np.isfinite(rho) & np.isfinite(phi).all(axis=0)
    weights = np.zeros((len(cells.pairs), len(cells.x)))
    weights[cells.pair[ok], np.flatnonzero(ok)] = 1.0
    counts = weights.sum(axis=1)
    weights[counts > 0] /= counts[counts > 0, None]
    means = np.where(ok, phi, 0.0) @ weights.T
    means[:, counts == 0] = np.nan
    out: np.ndarray = means
    return out


def cell_projections(hsic: np.ndarray, psi: np.ndarray) -> np.ndarray:
    """(N, L, L): each image's projection φ of every cell's CKA (NaN where a cell is undefined).

    ``hsic``: the whole plan's (L, L) HSIC; ``psi``: (N, L, L), every image's term ψ of every
    pair of layers, scaled by √(n/(n−1)) per batch as :func:`diagonal_terms`' are, so that
    ``Σ_a φ_a²`` of a cell is the variance of its image interval.
    """
    d = np.diag(hsic)
    own = np.diagonal(psi, axis1=1, axis2=2)  # (N, L): each layer with itself
    with np.errstate(divide="ignore", invalid="ignore"):
        dd = np.sqrt(np.outer(d, d))
        rho = hsic / dd
        rho[~((d[:, None] > 0) & (d[None, :] > 0))] = np.nan
        ratio = own / d
        phi: np.ndarray = psi / dd - rho / 2 * (ratio[:, :, None] + ratio[:, None, :])
    return phi


def paired_variance(left: np.ndarray, right: np.ndarray) -> float:
    """The image variance of ``left − right``: Σ_a (φ_a − φ'_a)² over the same N images."""
    a, b = np.asarray(left, dtype=float), np.asarray(right, dtype=float)
    if a.shape != b.shape:
        raise ValueError("paired projections need the same images on both sides")
    return float(np.sum((a - b) ** 2))


def unpaired_variance(left: np.ndarray, right: np.ndarray) -> float:
    """The image variance of ``left − right`` over independent samples: Σ φ_a² + Σ φ'_b²."""
    return float(np.sum(np.asarray(left) ** 2) + np.sum(np.asarray(right) ** 2))
