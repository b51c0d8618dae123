"""Per-layer spectra of the centred Grams, and CKA with each layer's top component removed.

For a batch, K_c = HKH (H = I - 11ᵀ/n) has eigenvalues λ_1 ≥ λ_2 ≥ … ≥ 0; for the linear
kernel they are the variances (times n) of the batch's principal components.

* **Effective dimensionality**: the participation ratio ``(Σλ)² / Σλ² = tr(K_c)² / ‖K_c‖²_F``
  (no eigendecomposition needed). 1 when one direction carries all the variance, the rank
  when all carry the same. A batch of n samples has at most n - 1 directions, so this
  minibatch estimate is capped at n - 1 and averaged over batches.
* **Top-component share**: ``λ_1 / Σλ``, also averaged over batches.
* **Sensitivity** (opt-in, :func:`whole_sample_sensitivity`): CKA after removing one side's
  top principal direction *of the whole sample*, the same direction at any batch size. The run
  keeps every selected layer's features (n × d floats per layer, as ``full`` mode does); w is
  the top right singular vector of the whole sample's centred features (an eigenvector of
  XᵀX when d ≤ n, else Xᵀu/‖Xᵀu‖ with u the top eigenvector of XXᵀ), in float64. Removing it
  (X ↦ X(I - wwᵀ)) changes each batch's linear Gram by a rank-one update, ``K - zzᵀ`` with
  z = Xw (a constant shift of z changes no HSIC); for the rbf kernel the deflated features'
  Gram is formed again. Every batch's deflated Gram then meets every intact one.

The top-component share's λ_1 comes from subspace iteration with :data:`BLOCK` vectors and
:data:`ITERATIONS` steps followed by Rayleigh-Ritz (the Ritz value's error shrinks like
(λ_{BLOCK+1}/λ_1)^(2k)), in float32 on the device: a few products of the (L, n, n) stack
instead of L eigendecompositions. Where λ_1 ≈ λ_2 the "top direction" is itself ill-defined,
and any direction of that cluster is as good an answer.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.hsic import centred_rows, hsic_block, hsic_self
from analysis.kernels import Kernel, gram

__all__ = [
    "BLOCK",
    "ITERATIONS",
    "SpectrumAccumulator",
    "layer_spectra",
    "top_directions",
    "whole_sample_sensitivity",
]

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


def top_directions(features: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each layer's top principal direction over all its samples (n, d_i): a unit float64 (d_i,)."""
    out = []
    for x in features:
        xc = x.to(torch.float64)
        xc = xc - xc.mean(0, keepdim=True)
        n, d = xc.shape
        if d <= n:
            w = torch.linalg.eigh(xc.T @ xc)[1][:, -1]
        else:
            w = xc.T @ torch.linalg.eigh(xc @ xc.T)[1][:, -1]
            w = w / torch.linalg.vector_norm(w).clamp(min=1e-300)
        out.append(w)
    return out


def whole_sample_sensitivity(
    features: list[torch.Tensor], sizes: list[int], kern: Kernel, estimator: str
) -> tuple[np.ndarray, np.ndarray]:
    """Deflated HSIC sums over the batches (of ``sizes`` samples, in order) of ``features``.

    ``deflated_cross[i, j]``: layer i without its whole-sample top direction against layer j
    intact; ``deflated_self[i]``: layer i deflated against itself. The intact Grams are formed
    as the main pass formed them (the features' precision, ``kern``).
    """
    ws = top_directions(features)
    n_layers = len(features)
    cross = torch.zeros(n_layers, n_layers, dtype=torch.float64)
    own = torch.zeros(n_layers, dtype=torch.float64)
    start = 0
    for n in sizes:
        xs = [f[start : start + n] for f in features]
        start += n
        grams = torch.stack([gram(x, kern) for x in xs])
        if kern.name == "linear":
            zs = torch.stack([x.to(torch.float64) @ w for x, w in zip(xs, ws, strict=True)])
            deflated = grams.to(torch.float64) - zs.unsqueeze(2) * zs.unsqueeze(1)
        else:
            deflated = torch.stack(
                [
                    gram(x64 - torch.outer(x64 @ w, w), kern)
                    for x64, w in ((x.to(torch.float64), w) for x, w in zip(xs, ws, strict=True))
                ]
            )
        rows, drows = centred_rows(grams, estimator), centred_rows(deflated, estimator)
        cross += hsic_block(drows, rows, estimator).cpu()
        own += hsic_self(drows, estimator).cpu()
    return cross.numpy(), own.numpy()


class SpectrumAccumulator:
    """Sums per-layer spectra (participation ratio, top-component share) over batches."""

    def __init__(self, n_layers: int) -> None:
        self.pr = torch.zeros(n_layers, dtype=torch.float64)
        self.share = torch.zeros(n_layers, dtype=torch.float64)
        self.batches = 0

    def add(self, grams: torch.Tensor) -> None:
        """One batch: its raw Grams (L, n, n)."""
        pr, share = layer_spectra(grams)
        self.pr += pr.cpu()
        self.share += share.cpu()
        self.batches += 1

    def state(self) -> dict[str, np.ndarray]:
        """The sums as float64 arrays (``batches`` a 0-d int64): summing the states of runs
        over disjoint batches gives the state of one run over all of them."""
        return {
            "pr": self.pr.numpy().copy(),
            "share": self.share.numpy().copy(),
            "batches": np.array(self.batches, dtype=np.int64),
        }

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Participation ratio and top share per layer, averaged over the batches seen."""
        return self.pr / max(self.batches, 1), self.share / max(self.batches, 1)
