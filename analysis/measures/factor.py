"""Each layer's centred features factorised once, for every whole-sample measure of its pairs.

A layer's features X (n × d) are centred over the samples and split by one thin SVD,
X = U S Vᵀ, in float64 (fp32 features through the eigendecomposition of their smaller Gram).
Its rank r counts the singular values above ``s₁ · max(n, d) · ε`` with ε the machine epsilon
*of the features' own dtype* (the usual numerical-rank rule, at the
precision the features were computed in: fp32 activations carry fp32 rounding, and directions
below it are noise that CCA would otherwise whiten up to correlation 1). What the pairs read:

* ``q`` (n × r): an orthonormal basis of the centred features' column space, U's first r
  columns, ordered by singular value (SVCCA keeps a prefix of it);
* ``s`` (r): the singular values (‖X‖²_F = Σ s², XᵀY's singular values come from S_X M S_Y);
* ``loadings`` (r × d): Qᵀ X = S Vᵀ, and ``means`` (d): the neurons' means over the samples,
  only for PWCCA (its weights are sums over the uncentred neurons X + 1 μᵀ).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SVCCA_VARIANCE", "Factor", "centred", "factorise"]

# SVCCA keeps each side's top singular directions that explain this share of its variance
# (Raghu et al. 2017).
SVCCA_VARIANCE = 0.99


# Features this coarse (fp32 and below) are factorised through their smaller Gram matrix: its
# eigenvalues carry singular values down to √ε₆₄ · s₁ ≈ 1.5e-8 · s₁, far below the rank threshold
# of such features (max(n, d) · ε ≥ 1.2e-7 · max(n, d) · s₁), and eigh of the n × n or d × d
# Gram took a third to a tenth of the SVD's time on the demo's layers (450 × 512).
GRAM_EPS = 1e-7


def _through_gram(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The thin SVD of ``x`` (n × d) from the eigendecomposition of its smaller Gram, singular
    values descending (directions of zero singular value are left to the rank cut)."""
    n, d = x.shape
    w, vecs = torch.linalg.eigh(x @ x.T if n <= d else x.T @ x)
    w, vecs = w.flip(0), vecs.flip(1)
    s = w.clamp_min(0).sqrt()
    safe = torch.where(s > 0, s, torch.ones_like(s))
    if n <= d:
        return vecs, s, (vecs.T @ x) / safe[:, None]
    return (x @ vecs) / safe[None, :], s, vecs.T


def centred(features: torch.Tensor) -> torch.Tensor:
    """``features`` (n, …) as float64 (n, d), each column's mean over the samples removed."""
    x = features.reshape(features.shape[0], -1).to(torch.float64)
    return x - x.mean(dim=0, keepdim=True)


@dataclass(frozen=True)
class Factor:
    """One layer's centred features, factorised (see the module docstring)."""

    n: int
    width: int
    q: torch.Tensor
    s: torch.Tensor
    loadings: torch.Tensor | None
    svcca_rank: int
    means: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        """The numerical rank of the centred features (at most n − 1 and d)."""
        return int(self.s.shape[0])


def factorise(features: torch.Tensor, *, loadings: bool = False) -> Factor:
    """The :class:`Factor` of one layer's ``features`` (n, …); ``loadings`` for PWCCA."""
    eps = torch.finfo(features.dtype).eps if features.is_floating_point() else 0.0
    raw = features.reshape(features.shape[0], -1).to(torch.float64)
    means = raw.mean(dim=0)
    x = raw - means
    n, d = x.shape
    if eps >= GRAM_EPS:
        u, s, vh = _through_gram(x)
    else:
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
    top = float(s[0]) if s.numel() else 0.0
    r = int((s > top * max(n, d) * eps).sum()) if top > 0 else 0
    u, s, vh = u[:, :r], s[:r], vh[:r]
    share = torch.cumsum(s**2, 0) / (s**2).sum() if r else s
    # the fewest leading directions whose share reaches SVCCA_VARIANCE (rounding-safe)
    kept = int((share < SVCCA_VARIANCE - 1e-12).sum()) + 1 if r else 0
    return Factor(
        n=n,
        width=d,
        q=u.contiguous(),
        s=s,
        loadings=(s[:, None] * vh) if loadings else None,
        svcca_rank=min(kept, r),
        means=means if loadings else None,
    )
