"""The CCA family between two factorised layers: R²_CCA, ρ̄, SVCCA and PWCCA.

With Q_X, Q_Y orthonormal bases of the two centred sides (ranks r_X, r_Y), the canonical
correlations ρ₁ ≥ … ≥ ρ_c (c = min(r_X, r_Y)) are the singular values of M = Q_Xᵀ Q_Y
(Björck & Golub 1973), so one product and one small SVD per pair give them all:

* ``cca``: R²_CCA = ‖Q_Yᵀ Q_X‖²_F / c, the mean squared canonical correlation (Kornblith et al.
  2019, §3; c is min(p_X, p_Y) for full-rank sides);
* ``cca_mean``: ρ̄ = Σ ρᵢ / c;
* ``svcca``: R²_CCA between the sides reduced to their top singular directions that explain
  99 % of their variance (Raghu et al. 2017): M's leading k_X × k_Y block;
* ``pwcca``: Σ αᵢ ρᵢ with αᵢ ∝ Σⱼ |⟨hᵢ, xⱼ⟩| (Morcos et al. 2018), hᵢ = Q_X aᵢ the unit
  canonical variates of X and xⱼ its centred neurons; symmetrised as the mean of the X- and
  Y-weighted values.

Degenerate: the centred samples span an (n − 1)-dimensional space, so whatever the data at least
r_X + r_Y − (n − 1) canonical correlations are 1 — all of them once a side spans it (d ≥ n − 1).
:func:`degenerate` says when a cell is in that regime; the value is reported as it is.
"""

from __future__ import annotations

import torch

from analysis.measures.factor import Factor

__all__ = ["cca_family", "degenerate"]


def degenerate(fx: Factor, fy: Factor) -> bool:
    """Whether some canonical correlation of the pair is 1 by dimension counting alone."""
    return fx.rank + fy.rank > fx.n - 1


def cca_family(fx: Factor, fy: Factor, names: set[str]) -> dict[str, float]:
    """The CCA-family measures in ``names`` between the layers ``fx`` and ``fy`` (NaN where a
    side has rank 0)."""
    c = min(fx.rank, fy.rank)
    if c == 0:
        return dict.fromkeys(names, float("nan"))
    m = fx.q.T @ fy.q
    out: dict[str, float] = {}
    if "cca" in names:
        out["cca"] = float((m**2).sum()) / c
    if "svcca" in names:
        kx, ky = fx.svcca_rank, fy.svcca_rank
        out["svcca"] = float((m[:kx, :ky] ** 2).sum()) / min(kx, ky)
    if names & {"cca_mean", "pwcca"}:
        a, rho, bh = torch.linalg.svd(m, full_matrices=False)
        rho = rho[:c].clamp(0.0, 1.0)
        if "cca_mean" in names:
            out["cca_mean"] = float(rho.sum()) / c
        if "pwcca" in names:
            assert fx.loadings is not None and fy.loadings is not None
            out["pwcca"] = (_weighted(a[:, :c].T, fx, rho) + _weighted(bh[:c], fy, rho)) / 2
    return out


def _weighted(directions: torch.Tensor, side: Factor, rho: torch.Tensor) -> float:
    """Σ αᵢ ρᵢ with one side's projection weights: its canonical variates hᵢ = Q aᵢ (rows of
    ``directions`` are the aᵢ) against its neurons, ⟨hᵢ, xⱼ⟩ = (aᵢᵀ Qᵀ X)ⱼ."""
    assert side.loadings is not None
    alpha = (directions @ side.loadings).abs().sum(dim=1)
    return float((alpha * rho).sum() / alpha.sum())
