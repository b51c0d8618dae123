"""Per-layer spectra of the centred Grams, and CKA with each layer's top component removed.

For a batch, K_c = HKH (H = I - 11ᵀ/n) has eigenvalues λ_1 ≥ λ_2 ≥ … ≥ 0; for the linear
kernel they are the variances (times n) of the batch's principal components.

* **Effective dimensionality**: the participation ratio ``(Σλ)² / Σλ² = tr(K_c)² / ‖K_c‖²_F``
  (no eigendecomposition needed). 1 when one direction carries all the variance, the rank
  when all carry the same. A batch of n samples has at most n - 1 directions, so this
  minibatch estimate is capped at n - 1 and averaged over batches.
* **Top-component share**: ``λ_1 / Σλ``, also averaged over batches.
* **Sensitivity** (opt-in): CKA after removing the top direction of one side. For the linear
  kernel, removing the feature direction w from X (X ↦ X(I - wwᵀ)) changes the Gram to
  ``K - zzᵀ`` with z = Xw. Taking w = Xᵀu/‖Xᵀu‖ for a unit vector u in sample space gives
  ``z = K_c u / sqrt(uᵀK_c u)``; with u the top eigenvector u_1 that is exactly
  ``K_c - λ_1 u_1 u_1ᵀ``, the top principal component removed. The deflation is a genuine
  feature-space projection for any u, so a u that is not fully converged still removes a
  (nearly top) direction rather than producing a matrix that is no Gram at all. For the rbf
  kernel the same deflation removes the top kernel principal component.

λ_1 and u_1 come from subspace iteration with :data:`BLOCK` vectors and :data:`ITERATIONS`
steps followed by Rayleigh-Ritz (the Ritz value's error shrinks like (λ_{BLOCK+1}/λ_1)^(2k)),
in float32 on the device: a few products of the (L, n, n) stack instead of L eigendecompositions.
Where λ_1 ≈ λ_2 the "top direction" is itself ill-defined, and any direction of that cluster is
as good an answer.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.hsic import centred_rows, hsic_block

__all__ = ["BLOCK", "ITERATIONS", "SpectrumAccumulator", "deflate_top", "layer_spectra"]

BLOCK = 4
ITERATIONS = 24


def _centre(grams: torch.Tensor) -> torch.Tensor:
    g = grams.to(torch.float32, copy=True)
    g -= g.mean(2, keepdim=True)
    g -= g.mean(1, keepdim=True)
    return (g + g.transpose(1, 2)) / 2  # exactly symmetric for the Ritz step


def _top_pair(kc: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(λ_1 (L,), u_1 (L, n)) of each centred Gram, by subspace iteration + Rayleigh-Ritz."""
    n_layers, n, _ = kc.shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(n, min(BLOCK, n), generator=gen).to(kc)
    q = q.expand(n_layers, -1, -1)
    for _ in range(ITERATIONS):
        q, _ = torch.linalg.qr(kc @ q)
    t = q.transpose(1, 2) @ kc @ q
    vals, vecs = torch.linalg.eigh((t + t.transpose(1, 2)) / 2)
    u = (q @ vecs[:, :, -1:]).squeeze(2)
    return vals[:, -1].clamp(min=0), u


def layer_spectra(grams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Participation ratio and top-component share (each (L,), float64) of raw Grams (L, n, n).

    NaN for a layer whose centred Gram is zero (a constant layer has no directions).
    """
    kc = _centre(grams)
    tr = kc.diagonal(dim1=1, dim2=2).sum(1).double()
    fro = kc.double().square().sum((1, 2))
    lam, _ = _top_pair(kc)
    ok = tr > 0
    nan = torch.full_like(tr, float("nan"))
    pr = torch.where(ok, tr.square() / torch.where(ok, fro, 1.0), nan)
    share = torch.where(ok, lam.double() / torch.where(ok, tr, 1.0), nan)
    return pr, share


def deflate_top(grams: torch.Tensor) -> torch.Tensor:
    """Centred Grams (L, n, n), float64, with each layer's top direction removed (see above)."""
    kc = _centre(grams)
    _, u = _top_pair(kc)
    kd = kc.double()
    z = (kd @ u.double().unsqueeze(2)).squeeze(2)  # K_c u
    quad = (z * u.double()).sum(1)  # uᵀK_c u, ≈ λ_1
    scale = torch.where(quad > 0, quad, 1.0).rsqrt() * (quad > 0)
    z = z * scale[:, None]
    return kd - z.unsqueeze(2) * z.unsqueeze(1)


class SpectrumAccumulator:
    """Sums per-layer spectra over batches and, with ``sensitivity``, the deflated HSIC terms.

    ``deflated_cross[i, j]``: summed HSIC between layer i with its top direction removed and
    layer j intact; ``deflated_self[i]``: summed HSIC of deflated layer i with itself.
    """

    def __init__(self, n_layers: int, estimator: str, sensitivity: bool) -> None:
        self.estimator, self.sensitivity = estimator, sensitivity
        self.pr = torch.zeros(n_layers, dtype=torch.float64)
        self.share = torch.zeros(n_layers, dtype=torch.float64)
        self.batches = 0
        self.deflated_cross = torch.zeros(n_layers, n_layers, dtype=torch.float64)
        self.deflated_self = torch.zeros(n_layers, dtype=torch.float64)

    def add(self, grams: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor]) -> None:
        """One batch: its raw Grams (L, n, n) and their :func:`centred_rows`."""
        pr, share = layer_spectra(grams)
        self.pr += pr.cpu()
        self.share += share.cpu()
        self.batches += 1
        if self.sensitivity:
            deflated = centred_rows(deflate_top(grams), self.estimator)
            self.deflated_cross += hsic_block(deflated, rows, self.estimator).cpu()
            fd, rd = deflated
            self.deflated_self += hsic_block((fd, rd), (fd, rd), self.estimator).diagonal().cpu()

    def state(self) -> dict[str, np.ndarray]:
        """The sums as float64 arrays (``batches`` a 0-d int64): summing the states of runs
        over disjoint batches gives the state of one run over all of them."""
        return {
            "pr": self.pr.numpy().copy(),
            "share": self.share.numpy().copy(),
            "deflated_cross": self.deflated_cross.numpy().copy(),
            "deflated_self": self.deflated_self.numpy().copy(),
            "batches": np.array(self.batches, dtype=np.int64),
        }

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Participation ratio and top share per layer, averaged over the batches seen."""
        return self.pr / max(self.batches, 1), self.share / max(self.batches, 1)
