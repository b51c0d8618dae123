"""Linear regression between two factorised layers (Kornblith et al. 2019, §3 and appendix).

Fitting Y from X by least squares leaves R² = ‖Q_Xᵀ Y‖²_F / ‖Y‖²_F of Y's variance explained.
With Y = Q_Y S_Y V_Yᵀ that is ‖M S_Y‖²_F / ‖S_Y‖² (M = Q_Xᵀ Q_Y). Not symmetric; the measure
is the mean of both directions.
"""

from __future__ import annotations

from analysis.measures.factor import Factor

__all__ = ["linreg"]


def linreg(fx: Factor, fy: Factor) -> float:
    """The mean of R²(Y from X) and R²(X from Y); NaN where a side has no variance."""
    if fx.rank == 0 or fy.rank == 0:
        return float("nan")
    m = fx.q.T @ fy.q
    y_from_x = float(((m * fy.s[None, :]) ** 2).sum() / (fy.s**2).sum())
    x_from_y = float(((m * fx.s[:, None]) ** 2).sum() / (fx.s**2).sum())
    return (y_from_x + x_from_y) / 2
