"""HSIC estimators for every pair of a stack of Gram matrices at once, and CKA from HSIC.

For Grams K, L of one batch of n samples, H = I - 11ᵀ/n:

* biased (Gretton et al. 2005): ``HSIC_b(K, L) = tr(K H L H) / (n-1)² = ⟨HKH, HLH⟩ / (n-1)²``.
* unbiased (Song et al. 2012), with K̃ = K with its diagonal set to zero::

      HSIC_u(K, L) = [tr(K̃L̃) + (1ᵀK̃1)(1ᵀL̃1) / ((n-1)(n-2)) - 2/(n-2) · 1ᵀK̃L̃1] / (n(n-3))

  It is a U-statistic, so it is unchanged, exactly, when K becomes K + a1ᵀ + 1aᵀ + c11ᵀ;
  double centring is such a change, so we may centre first. We do, because the centred
  Gram has small entries and the three terms then cancel far less.

All pairs with matrix products: let f = vec(K̃), r = K̃1 and s = 1ᵀK̃1 per Gram, stacked
into F (L, n²), R (L, n) and s (L). Then tr(K̃L̃) = f_K·f_L and 1ᵀK̃L̃1 = r_K·r_L, so the
whole L×L matrix is ``(F Fᵀ + s sᵀ/((n-1)(n-2)) - 2/(n-2) R Rᵀ) / (n(n-3))``; the biased one
is ``F Fᵀ / (n-1)²`` with F = vec(HKH). This stage runs in float64: one (L, n²) copy, small
next to the forward passes, and it keeps the sums over n² terms exact to ~1e-15.

CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) · HSIC(L, L)) (Kornblith et al. 2019); summing the
HSIC terms of consecutive minibatches before this ratio is minibatch CKA (Nguyen et al. 2021).
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import torch

from analysis.errors import EstimatorError

__all__ = [
    "ESTIMATORS",
    "MIN_SAMPLES",
    "Estimator",
    "centred_rows",
    "check_estimator",
    "cka_from_hsic",
    "hsic_block",
    "hsic_from_grams",
    "hsic_from_linear_products",
    "hsic_linear_features",
    "hsic_self",
    "undefined_reasons",
]

Estimator = Literal["biased", "unbiased"]
ESTIMATORS: tuple[Estimator, ...] = get_args(Estimator)
# The smallest batch on which each estimator is defined (its denominators are non-zero).
MIN_SAMPLES = {"biased": 2, "unbiased": 4}


def check_estimator(estimator: str) -> str:
    """Return ``estimator`` if it names an estimator, else raise :class:`EstimatorError`."""
    if estimator not in ESTIMATORS:
        raise EstimatorError(f"unknown estimator {estimator!r}; use 'biased' or 'unbiased'")
    return estimator


def _combine(
    ff: torch.Tensor, ra: torch.Tensor, rb: torch.Tensor, n: int, estimator: str
) -> torch.Tensor:
    """HSIC from F_a F_bᵀ and (unbiased) the row sums R_a, R_b of the zero-diagonal Grams."""
    if estimator == "biased":
        return ff / (n - 1) ** 2
    sa, sb = ra.sum(1), rb.sum(1)
    return (ff + torch.outer(sa, sb) / ((n - 1) * (n - 2)) - (2 / (n - 2)) * (ra @ rb.T)) / (
        n * (n - 3)
    )


def centred_rows(grams: torch.Tensor, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows F (L, n²) and R (L, n) of raw Grams ``grams`` (L, n, n), in float64.

    F holds vec(HKH), with its diagonal zeroed for the unbiased estimator, and R its row sums:
    everything :func:`hsic_block` needs from one stack.
    """
    n_layers, n, _ = grams.shape
    g = grams.to(torch.float64, copy=True)
    # double centring HKH, in place: subtract row and column means, add back the grand mean
    g -= g.mean(2, keepdim=True)
    g -= g.mean(1, keepdim=True)
    if estimator == "unbiased":
        g.diagonal(dim1=1, dim2=2).zero_()
    return g.view(n_layers, n * n), g.sum(2)


def hsic_block(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], estimator: str
) -> torch.Tensor:
    """HSIC (L_a, L_b) between every layer of two stacks given as :func:`centred_rows`."""
    (fa, ra), (fb, rb) = a, b
    return _combine(fa @ fb.T, ra, rb, ra.shape[1], estimator)


def hsic_self(rows: tuple[torch.Tensor, torch.Tensor], estimator: str) -> torch.Tensor:
    """HSIC (L,) of each layer of a :func:`centred_rows` stack with itself: the diagonal of
    :func:`hsic_block` without the rest of the product."""
    f, r = rows
    n = r.shape[1]
    ff = f.square().sum(1)
    if estimator == "biased":
        return ff / (n - 1) ** 2
    s = r.sum(1)
    return (ff + s.square() / ((n - 1) * (n - 2)) - (2 / (n - 2)) * r.square().sum(1)) / (
        n * (n - 3)
    )


def hsic_from_grams(grams: torch.Tensor, estimator: str) -> torch.Tensor:
    """HSIC of every pair of the raw Grams ``grams`` (L, n, n), as a float64 (L, L) tensor.

    The result stays on the Grams' device and is symmetric bit for bit.
    """
    rows = centred_rows(grams, estimator)
    h = hsic_block(rows, rows, estimator)
    return (h + h.T) / 2  # the GEMM need not be symmetric to the last bit; this is


def hsic_linear_features(xs: list[torch.Tensor], estimator: str) -> torch.Tensor:
    """HSIC of every pair of linear-kernel layers straight from features ``xs`` (n, d_i).

    The feature-space identities, with X centred (x_i minus the mean) and k = diag(XXᵀ):
    ⟨HKH, HLH⟩ = ‖XᵀY‖²_F; for the unbiased estimator K̃ = XXᵀ - diag(k) gives
    f_K·f_L = ‖XᵀY‖²_F - k_K·k_L and, because XXᵀ1 = 0, r = -k. Costs n·d_i·d_j per pair
    instead of n²·d per layer, so it pays when every d < n. Runs in float64.
    """
    cs = [x.to(torch.float64) for x in xs]
    cs = [c - c[:1] for c in cs]
    cs = [c - c.mean(0, keepdim=True) for c in cs]
    ff = torch.empty(len(cs), len(cs), dtype=torch.float64, device=cs[0].device)
    for i, a in enumerate(cs):
        for j in range(i, len(cs)):
            ff[i, j] = ff[j, i] = torch.linalg.matrix_norm(a.T @ cs[j]) ** 2
    k = torch.stack([(c * c).sum(1) for c in cs])
    h = hsic_from_linear_products(ff, k, k, estimator)
    return (h + h.T) / 2


def hsic_from_linear_products(
    ff: torch.Tensor, kx: torch.Tensor, ky: torch.Tensor, estimator: str
) -> torch.Tensor:
    """HSIC (L_x, L_y) of linear-kernel layers from ``ff[i, j] = ‖X_iᵀY_j‖²_F`` of centred
    features and their squared row norms ``kx`` (L_x, n), ``ky`` (L_y, n): the identities of
    :func:`hsic_linear_features`, for callers that form the products their own way."""
    n = kx.shape[1]
    if estimator == "biased":
        return ff / (n - 1) ** 2
    return _combine(ff - kx @ ky.T, -kx, -ky, n, estimator)


def cka_from_hsic(
    hsic: np.ndarray, rows: np.ndarray | None = None, cols: np.ndarray | None = None
) -> np.ndarray:
    """CKA from HSIC: ``hsic[..., i, j] / sqrt(rows[..., i] · cols[..., j])``, NaN where undefined.

    The one place of the HSIC→CKA step and its undefined-cell rule: a cell is undefined (NaN)
    where the self-HSIC of either side is not positive or not finite, or the ratio is not
    finite; :func:`undefined_reasons` says why, for the diagnostics. ``hsic`` may be a stack
    (..., L, L) of HSIC matrices (bootstrap replicates, permutations); the self-HSICs default
    to its diagonal, and may be given apart: a null's cross terms against the observed
    self-HSIC, or a deflated layer's self-HSIC on the rows against the intact one on the
    columns. Never clamps: a negative cross-HSIC (possible with the unbiased estimator) gives a
    negative CKA.
    """
    h = np.asarray(hsic, dtype=np.float64)
    diag = np.diagonal(h, axis1=-2, axis2=-1)
    r = np.array(diag if rows is None else rows, dtype=np.float64)
    c = np.array(diag if cols is None else cols, dtype=np.float64)
    ok_r, ok_c = np.isfinite(r) & (r > 0), np.isfinite(c) & (c > 0)
    r[~ok_r] = 1.0
    c[~ok_c] = 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        cka: np.ndarray = h / np.sqrt(r[..., :, None] * c[..., None, :])
    cka[~(ok_r[..., :, None] & ok_c[..., None, :] & np.isfinite(cka))] = np.nan
    return cka


def undefined_reasons(h: np.ndarray) -> dict[int, str]:
    """Why each layer (by index) whose self-HSIC is unusable gives undefined CKA cells."""
    reasons: dict[int, str] = {}
    for i, v in enumerate(np.diag(h)):
        if not np.isfinite(v):
            reasons[i] = "self-HSIC is not finite (activations overflow)"
        elif v == 0:
            reasons[i] = "self-HSIC is 0: the layer's activations are constant over the data"
        elif v < 0:
            reasons[i] = (
                f"self-HSIC is negative ({v:.3g}): too few samples for the unbiased "
                "estimator to resolve this layer"
            )
    return reasons
