"""The orthogonal Procrustes similarity (Ding et al. 2021; Williams et al. 2021).

max over orthogonal R of ⟨X, Y R⟩ / (‖X‖_F ‖Y‖_F) = ‖XᵀY‖_* / (‖X‖_F ‖Y‖_F), the nuclear norm
(Schönemann 1966); arccos of it is Williams et al.'s angular Procrustes distance. With
X = Q_X S_X V_Xᵀ the singular values of XᵀY are those of S_X M S_Y (M = Q_Xᵀ Q_Y).

Saturated: where both sides span every centred direction of the sample (rank n − 1, as layers at
least as wide as the sample do), M is an orthogonal matrix and the similarity reads little
beyond the two spectra (where both are flat it is 1 whatever M): wide layers over few images
come out near 1 in every cell.
"""

from __future__ import annotations

import torch

from analysis.measures.protocol import Flag, Layer, Measure, Pair

__all__ = ["PROCRUSTES", "SATURATED", "procrustes"]


def procrustes(pair: Pair) -> float:
    """‖XᵀY‖_* / (‖X‖_F ‖Y‖_F) of the centred sides; NaN where a side has no variance."""
    fx, fy = pair.x.factor, pair.y.factor
    assert fx is not None and fy is not None
    if fx.rank == 0 or fy.rank == 0:
        return float("nan")
    cross = fx.s[:, None] * pair.cross * fy.s[None, :]
    nuclear = torch.linalg.svdvals(cross).sum()
    return float(nuclear / (fx.s.norm() * fy.s.norm()))


def _saturated(x: Layer, y: Layer) -> bool:
    return x.spans_sample and y.spans_sample


SATURATED = Flag(
    "procrustes_saturated",
    "Procrustes saturated: both layers span the sample",
    "Procrustes is saturated in {count} cells: both of their layers span every centred "
    "direction of the sample (rank n − 1), so the similarity reads little beyond their "
    "spectra; use more images than features (docs/measures.md)",
    _saturated,
)

PROCRUSTES = Measure(
    "procrustes",
    "Procrustes similarity",
    "analysis.measures.procrustes: ‖XᵀY‖_* / (‖X‖_F ‖Y‖_F)",
    procrustes,
    needs=frozenset({"factor"}),
    flags=(SATURATED,),
)
