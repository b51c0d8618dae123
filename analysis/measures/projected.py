"""The R² measures of every pair at once, through each layer's n × n projector.

‖Q_Xᵀ Q_Y‖²_F = ⟨P_X, P_Y⟩_F with P = Q Qᵀ the projector onto a layer's centred column space,
and ‖Q_Xᵀ Y‖²_F = ⟨P_X, K_Y⟩_F with K = Y Yᵀ its centred Gram. So R²_CCA, SVCCA (P of the kept
directions) and linear regression of all L² pairs come from one (L, n²) × (n², L) product per
form instead of an n · r_X · r_Y product per pair: far cheaper when layers are wide (r near n),
at L · n² floats per form held at once — :func:`use_projectors` says when that fits.

A measure with this route declares the forms it reads (``projectors``, names of
:data:`FORMS`) and its matrix from them (``projected``, given a :class:`Projectors`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import cached_property

import numpy as np
import torch

from analysis.measures.factor import Factor

__all__ = ["FORMS", "PROJECTOR_BYTES", "Projectors", "projected_measures", "use_projectors"]

# The most memory the stacked projectors may take.
PROJECTOR_BYTES = 2**30
# The (L, n²) stacks a measure may read: P, the projector onto the centred column space; ``sv``,
# P of SVCCA's kept directions; ``k``, the centred Gram.
FORMS = ("p", "sv", "k")


def use_projectors(n: int, layers: int, forms: int) -> bool:
    """Whether the projector route fits :data:`PROJECTOR_BYTES` for ``forms`` stacks of
    ``layers`` layers over ``n`` samples (else each pair is computed from its bases)."""
    return forms > 0 and forms * layers * n * n * 8 <= PROJECTOR_BYTES


def _stack(mats: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([m.reshape(-1) for m in mats])


class Projectors:
    """The layers' stacked forms, each made when first read; ``inner(f, g)`` is the (L, L)
    matrix of ⟨f_i, g_j⟩_F."""

    def __init__(self, factors: Sequence[Factor]) -> None:
        self.factors = factors
        self.ranks = np.array([f.rank for f in factors], dtype=np.float64)
        self.kept = np.array([f.svcca_rank for f in factors], dtype=np.float64)
        self.total = np.array([float((f.s**2).sum()) for f in factors])

    @cached_property
    def p(self) -> torch.Tensor:
        return _stack([f.q @ f.q.T for f in self.factors])

    @cached_property
    def sv(self) -> torch.Tensor:
        return _stack([f.q[:, : f.svcca_rank] @ f.q[:, : f.svcca_rank].T for f in self.factors])

    @cached_property
    def k(self) -> torch.Tensor:
        return _stack([(f.q * f.s**2) @ f.q.T for f in self.factors])

    def inner(self, f: str, g: str) -> np.ndarray:
        """[i, j]: ⟨f_i, g_j⟩_F of the forms named ``f`` and ``g``."""
        left: torch.Tensor = getattr(self, f)
        right: torch.Tensor = getattr(self, g)
        return (left @ right.T).cpu().numpy()


def projected_measures(
    factors: Sequence[Factor], formulas: Iterable[tuple[str, Callable[[Projectors], np.ndarray]]]
) -> dict[str, np.ndarray]:
    """Each ``(name, formula)``'s matrix between every pair of ``factors`` (NaN where a side
    has rank 0); a formula returns its symmetric (L, L) matrix."""
    forms = Projectors(factors)
    out: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, formula in formulas:
            out[name] = formula(forms)
    empty = forms.ranks == 0
    for full in out.values():
        full[empty[:, None] | empty[None, :]] = np.nan
    return out
