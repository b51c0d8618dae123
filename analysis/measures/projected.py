"""The R² measures of every pair at once, through each layer's n × n projector.

‖Q_Xᵀ Q_Y‖²_F = ⟨P_X, P_Y⟩_F with P = Q Qᵀ the projector onto a layer's centred column space,
and ‖Q_Xᵀ Y‖²_F = ⟨P_X, K_Y⟩_F with K = Y Yᵀ its centred Gram. So R²_CCA, SVCCA (P of the kept
directions) and linear regression of all L² pairs come from one (L, n²) × (n², L) product per
form instead of an n · r_X · r_Y product per pair: far cheaper when layers are wide (r near n),
at L · n² floats per form held at once — :func:`use_projectors` says when that fits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from analysis.measures.factor import Factor

__all__ = [
    "PROJECTED",
    "PROJECTOR_BYTES",
    "projected_measures",
    "projector_forms",
    "use_projectors",
]

# The R² measures this route computes, and the most memory its stacked projectors may take.
PROJECTED = frozenset({"cca", "svcca", "linreg"})
PROJECTOR_BYTES = 2**30


def projector_forms(measures: Sequence[str] | set[str]) -> int:
    """How many (L, n²) stacks ``measures`` need: P (cca, linreg), P of SVCCA's directions,
    the Grams K (linreg)."""
    wanted = set(measures)
    return int(bool(wanted & {"cca", "linreg"})) + ("svcca" in wanted) + ("linreg" in wanted)


def use_projectors(n: int, layers: int, measures: Sequence[str] | set[str]) -> bool:
    """Whether the projector route fits :data:`PROJECTOR_BYTES` for ``layers`` layers over
    ``n`` samples (else each pair is computed from its bases)."""
    forms = projector_forms(measures)
    return forms > 0 and forms * layers * n * n * 8 <= PROJECTOR_BYTES


def _stack(mats: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([m.reshape(-1) for m in mats])


def projected_measures(factors: list[Factor], wanted: set[str]) -> dict[str, np.ndarray]:
    """The measures of ``wanted`` ∩ :data:`PROJECTED` between every pair of ``factors`` (NaN
    where a side has rank 0)."""
    ranks = np.array([f.rank for f in factors], dtype=np.float64)
    out: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        if wanted & {"cca", "linreg"}:
            p = _stack([f.q @ f.q.T for f in factors])
            if "cca" in wanted:
                inner = (p @ p.T).cpu().numpy()
                out["cca"] = inner / np.minimum.outer(ranks, ranks)
            if "linreg" in wanted:
                k = _stack([(f.q * f.s**2) @ f.q.T for f in factors])
                cross = (p @ k.T).cpu().numpy()  # [i, j]: ‖Q_iᵀ Y_j‖², Y_j fitted from X_i
                total = np.array([float((f.s**2).sum()) for f in factors])
                fit = cross / total[None, :]
                out["linreg"] = (fit + fit.T) / 2
            del p
        if "svcca" in wanted:
            kept = np.array([f.svcca_rank for f in factors], dtype=np.float64)
            sv = _stack([f.q[:, : f.svcca_rank] @ f.q[:, : f.svcca_rank].T for f in factors])
            out["svcca"] = (sv @ sv.T).cpu().numpy() / np.minimum.outer(kept, kept)
    for name, full in out.items():
        full[(ranks == 0)[:, None] | (ranks == 0)[None, :]] = np.nan
        out[name] = (full + full.T) / 2 if name != "linreg" else full
    return out
