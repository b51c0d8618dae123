"""Linear regression between two factorised layers (Kornblith et al. 2019, §3 and appendix).

Fitting Y from X by least squares leaves R² = ‖Q_Xᵀ Y‖²_F / ‖Y‖²_F of Y's variance explained.
With Y = Q_Y S_Y V_Yᵀ that is ‖M S_Y‖²_F / ‖S_Y‖² (M = Q_Xᵀ Q_Y). Not symmetric; the measure
is the mean of both directions.

Saturated: where a side spans every centred direction of the sample (rank n − 1, as a layer at
least as wide as the sample does), the other side is a linear image of it and its fit is exact,
R² = 1 whatever the data; the measure is then at least 1/2 (1 where both sides span it).
"""

from __future__ import annotations

import numpy as np

from analysis.measures.projected import Projectors
from analysis.measures.protocol import Flag, Layer, Measure, Pair

__all__ = ["LINREG", "SATURATED", "linreg"]


def linreg(pair: Pair) -> float:
    """The mean of R²(Y from X) and R²(X from Y); NaN where a side has no variance."""
    fx, fy = pair.x.factor, pair.y.factor
    assert fx is not None and fy is not None
    if fx.rank == 0 or fy.rank == 0:
        return float("nan")
    m = pair.cross
    y_from_x = float(((m * fy.s[None, :]) ** 2).sum() / (fy.s**2).sum())
    x_from_y = float(((m * fx.s[:, None]) ** 2).sum() / (fx.s**2).sum())
    return (y_from_x + x_from_y) / 2


def _saturated(x: Layer, y: Layer) -> bool:
    return x.spans_sample or y.spans_sample


SATURATED = Flag(
    "linreg_saturated",
    "linear regression saturated: a layer spans the sample",
    "linear regression is saturated in {count} cells: one of their layers spans every "
    "centred direction of the sample (rank n − 1), so the other is fitted from it exactly "
    "(R² = 1) whatever the data; use more images than features (docs/measures.md)",
    _saturated,
)


def _all_pairs(forms: Projectors) -> np.ndarray:
    """[i, j]: the mean of R²(layer j from layer i) and its reverse, from the projectors:
    ‖Q_iᵀ Y_j‖² = ⟨P_i, K_j⟩."""
    fit = forms.inner("p", "k") / forms.total[None, :]
    out: np.ndarray = (fit + fit.T) / 2
    return out


LINREG = Measure(
    "linreg",
    "linear regression R²",
    "analysis.measures.linreg: least-squares R², both directions' mean",
    linreg,
    needs=frozenset({"factor"}),
    flags=(SATURATED,),
    projected=_all_pairs,
    projectors=frozenset({"p", "k"}),
)
