"""The CCA family between two factorised layers: R²_CCA, ρ̄, SVCCA and PWCCA.

With Q_X, Q_Y orthonormal bases of the two centred sides (ranks r_X, r_Y), the canonical
correlations ρ₁ ≥ … ≥ ρ_c (c = min(r_X, r_Y)) are the singular values of M = Q_Xᵀ Q_Y
(Björck & Golub 1973), so one product and one small SVD per pair give them all:

* ``cca``: R²_CCA = ‖Q_Yᵀ Q_X‖²_F / c, the mean squared canonical correlation (Kornblith et al.
  2019, §3; c is min(p_X, p_Y) for full-rank sides);
* ``cca_mean``: ρ̄ = Σ ρᵢ / c;
* ``svcca``: R²_CCA between the sides reduced to their top singular directions that explain
  99 % of their variance (Raghu et al. 2017): M's leading k_X × k_Y block;
* ``pwcca``: projection-weighted CCA as the reference code of Morcos et al. 2018 computes it
  (``google/svcca``, ``pwcca.compute_pwcca``), the mean of its two directions
  (:func:`pwcca_sides`). Weighted on side X: with uᵢ = V_X aᵢ the i-th canonical coefficient
  vector over X's neurons (the reference's ``coef_x`` row; aᵢ the i-th left singular vector of
  M, V_X the right singular vectors of the centred X), the directions are gᵢ = X_c uᵢ + μᵢ·1
  (μᵢ the mean of X's i-th neuron: the reference adds the neuron means back, row by row),
  orthonormalised in order (QR) into pᵢ; αᵢ = Σⱼ |⟨pᵢ, xⱼ⟩| over X's *uncentred* neurons xⱼ, and
  the value is Σ αᵢ ρᵢ / Σ αᵢ over the c = min(r_X, r_Y) correlations. gᵢ changes with the sign
  of uᵢ, which an SVD leaves free: each uᵢ is signed so that its entry of largest magnitude is
  positive (scikit-learn's ``svd_flip`` rule); the reference takes whatever LAPACK returns.
  ``pwcca_sides(..., centred=True)`` gives Morcos et al.'s written definition instead: the
  unit canonical variates hᵢ = Q_X aᵢ against the centred neurons (docs/measures.md says when
  to prefer it).

Degenerate: the centred samples span an (n − 1)-dimensional space, so whatever the data at least
r_X + r_Y − (n − 1) canonical correlations are 1 — all of them once a side spans it (d ≥ n − 1).
:func:`degenerate` says when a cell is in that regime; the value is reported as it is.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.measures.factor import Factor
from analysis.measures.protocol import Flag, Layer, Measure, Pair

__all__ = ["CCA", "CCA_MEAN", "DEGENERATE", "PWCCA", "SVCCA", "degenerate", "pwcca_sides"]


def degenerate(fx: Factor, fy: Factor) -> bool:
    """Whether some canonical correlation of the pair is 1 by dimension counting alone."""
    return fx.rank + fy.rank > fx.n - 1


def _degenerate(x: Layer, y: Layer) -> bool:
    assert x.factor is not None and y.factor is not None
    return degenerate(x.factor, y.factor)


# Every measure of the family reads the canonical correlations, and so shares the flag.
DEGENERATE = Flag(
    "cca_degenerate",
    "CCA degenerate: the layers' ranks add up past n − 1",
    "CCA is degenerate in {count} cells: their layers' ranks add up past n − 1, so some "
    "canonical correlations are 1 whatever the data (all of them where a layer is as wide as "
    "the sample); use more images than features (docs/measures.md)",
    _degenerate,
)


def _sides(pair: Pair) -> tuple[Factor, Factor, int]:
    fx, fy = pair.x.factor, pair.y.factor
    assert fx is not None and fy is not None
    return fx, fy, min(fx.rank, fy.rank)


def _r2(pair: Pair) -> float:
    _, _, c = _sides(pair)
    return float((pair.cross**2).sum()) / c if c else float("nan")


def _svcca(pair: Pair) -> float:
    fx, fy, c = _sides(pair)
    if c == 0:
        return float("nan")
    kx, ky = fx.svcca_rank, fy.svcca_rank
    return float((pair.cross[:kx, :ky] ** 2).sum()) / min(kx, ky)


def _rho(pair: Pair) -> torch.Tensor:
    _, _, c = _sides(pair)
    return pair.canonical[1][:c].clamp(0.0, 1.0)


def _mean_rho(pair: Pair) -> float:
    _, _, c = _sides(pair)
    return float(_rho(pair).sum()) / c if c else float("nan")


def _pwcca(pair: Pair) -> float:
    fx, fy, c = _sides(pair)
    if c == 0:
        return float("nan")
    a, _, bh = pair.canonical
    x_side, y_side = _weighted_sides(fx, fy, (a[:, :c].T, _rho(pair), bh[:c]), centred=False)
    return (x_side + y_side) / 2


def pwcca_sides(fx: Factor, fy: Factor, *, centred: bool = False) -> tuple[float, float]:
    """PWCCA weighted on X's side and on Y's: the reference's ``compute_pwcca(X, Y)`` and
    ``compute_pwcca(Y, X)`` for full-rank sides (n > d) whose first argument is no wider than
    the second, up to the signs of its SVD (see the module docstring). Where the first is
    wider the reference fails (its second branch indexes the first layer's activations with
    the second's neurons); this weights the wider side's c leading directions the same way.
    ``centred``: Morcos et al.'s formula on the centred canonical variates instead."""
    c = min(fx.rank, fy.rank)
    if c == 0:
        return float("nan"), float("nan")
    a, rho, bh = torch.linalg.svd(fx.q.T @ fy.q, full_matrices=False)
    return _weighted_sides(fx, fy, (a[:, :c].T, rho[:c].clamp(0.0, 1.0), bh[:c]), centred=centred)


def _weighted_sides(
    fx: Factor, fy: Factor, svd: tuple[torch.Tensor, torch.Tensor, torch.Tensor], centred: bool
) -> tuple[float, float]:
    """Both sides' PWCCA from M's leading c singular triplets (rows aᵢ, ρ, rows bᵢ)."""
    assert fx.loadings is not None and fy.loadings is not None, "factorise(..., loadings=True)"
    a, rho, b = svd
    side = _centred_side if centred else _reference_side
    return side(a, fx, rho), side(b, fy, rho)


def _centred_side(directions: torch.Tensor, side: Factor, rho: torch.Tensor) -> float:
    """Σ αᵢ ρᵢ / Σ αᵢ with αᵢ = Σⱼ |⟨hᵢ, xⱼ⟩|: the unit canonical variates hᵢ = Q aᵢ (rows of
    ``directions`` are the aᵢ) against the centred neurons, ⟨hᵢ, xⱼ⟩ = (aᵢᵀ Qᵀ X)ⱼ."""
    assert side.loadings is not None
    alpha = (directions @ side.loadings).abs().sum(dim=1)
    return float((alpha * rho).sum() / alpha.sum())


def _reference_side(directions: torch.Tensor, side: Factor, rho: torch.Tensor) -> float:
    """Σ αᵢ ρᵢ / Σ αᵢ with the reference's weights (module docstring); ``directions``' rows
    are the aᵢ, in the side's basis Q."""
    assert side.loadings is not None and side.means is not None
    q, s, loadings, means = side.q, side.s, side.loadings, side.means
    c = directions.shape[0]
    coef = (directions / s) @ loadings  # uᵢᵀ = aᵢᵀ Vᵀ over the neurons, (c, d)
    top = coef.abs().argmax(dim=1, keepdim=True)
    sign = torch.sign(coef.gather(1, top)).squeeze(1)
    sign[sign == 0] = 1.0
    g = q @ (s[:, None] * directions.T) * sign + means[:c]  # gᵢ = X_c uᵢ + μᵢ·1, (n, c)
    p, _ = torch.linalg.qr(g)
    # ⟨pᵢ, xⱼ⟩ over the uncentred neurons xⱼ = X_c eⱼ + μⱼ·1
    w = (p.T @ q) @ loadings + p.sum(dim=0)[:, None] * means[None, :]
    alpha = w.abs().sum(dim=1)
    return float((alpha * rho).sum() / alpha.sum())


def _symmetric(full: np.ndarray) -> np.ndarray:
    out: np.ndarray = (full + full.T) / 2
    return out


CCA = Measure(
    "cca",
    "CCA R²",
    "analysis.measures.cca: mean squared canonical correlation R²_CCA",
    _r2,
    needs=frozenset({"factor"}),
    flags=(DEGENERATE,),
    projected=lambda f: _symmetric(f.inner("p", "p") / np.minimum.outer(f.ranks, f.ranks)),
    projectors=frozenset({"p"}),
)
CCA_MEAN = Measure(
    "cca_mean",
    "CCA mean ρ",
    "analysis.measures.cca: mean canonical correlation ρ̄",
    _mean_rho,
    needs=frozenset({"factor"}),
    flags=(DEGENERATE,),
)
SVCCA = Measure(
    "svcca",
    "SVCCA R²",
    "analysis.measures.cca: R²_CCA on the top directions with 99 % of the variance",
    _svcca,
    needs=frozenset({"factor"}),
    flags=(DEGENERATE,),
    projected=lambda f: _symmetric(f.inner("sv", "sv") / np.minimum.outer(f.kept, f.kept)),
    projectors=frozenset({"sv"}),
)
PWCCA = Measure(
    "pwcca",
    "PWCCA",
    "analysis.measures.cca: projection-weighted CCA, both directions' mean",
    _pwcca,
    needs=frozenset({"factor", "loadings"}),
    flags=(DEGENERATE,),
)
