"""The orthogonal Procrustes similarity (Ding et al. 2021; Williams et al. 2021).

max over orthogonal R of ⟨X, Y R⟩ / (‖X‖_F ‖Y‖_F) = ‖XᵀY‖_* / (‖X‖_F ‖Y‖_F), the nuclear norm
(Schönemann 1966); arccos of it is Williams et al.'s angular Procrustes distance. With
X = Q_X S_X V_Xᵀ the singular values of XᵀY are those of S_X M S_Y (M = Q_Xᵀ Q_Y).
"""

from __future__ import annotations

import torch

from analysis.measures.factor import Factor

__all__ = ["procrustes"]


def procrustes(fx: Factor, fy: Factor) -> float:
    """‖XᵀY‖_* / (‖X‖_F ‖Y‖_F) of the centred sides; NaN where a side has no variance."""
    if fx.rank == 0 or fy.rank == 0:
        return float("nan")
    cross = fx.s[:, None] * (fx.q.T @ fy.q) * fy.s[None, :]
    nuclear = torch.linalg.svdvals(cross).sum()
    return float(nuclear / (fx.s.norm() * fy.s.norm()))
