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

import numpy as np
import torch

from analysis.measures.factor import Factor
from analysis.measures.protocol import Flag, Layer, Measure, Pair

__all__ = ["CCA", "CCA_MEAN", "DEGENERATE", "PWCCA", "SVCCA", "degenerate"]


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
    rho = _rho(pair)
    return (_weighted(a[:, :c].T, fx, rho) + _weighted(bh[:c], fy, rho)) / 2


def _weighted(directions: torch.Tensor, side: Factor, rho: torch.Tensor) -> float:
    """Σ αᵢ ρᵢ with one side's projection weights: its canonical variates hᵢ = Q aᵢ (rows of
    ``directions`` are the aᵢ) against its neurons, ⟨hᵢ, xⱼ⟩ = (aᵢᵀ Qᵀ X)ⱼ."""
    assert side.loadings is not None
    alpha = (directions @ side.loadings).abs().sum(dim=1)
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
