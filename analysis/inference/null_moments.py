"""The permutation null of every CKA cell in closed form: its first four exact moments.

**The statistic.** Shuffling the samples of one side within a batch gives, for centred Grams A, B
of that batch and a uniformly random permutation π, the statistic ``T(π) = Σ_ij A_ij B_π(i)π(j)``
(:mod:`analysis.inference.permutation_null` draws it P times). Its mean, variance, third and fourth
moments over
*all* n! permutations have closed forms in a few per-layer numbers, so every cell's null costs a
handful of (L, L) products per batch instead of P Gram gathers.

**Unbiased estimator.** HSIC_u = ⟨Ã, B̃⟩ / (n(n-3)) with Ã the U-centred Gram (Székely & Rizzo
2014: zero diagonal, zero row sums; :func:`u_centre`). Per layer let Q = Σ_ij Ã_ij²,
c = Σ_ij Ã_ij³ and t = tr Ã³. Expand E[T^k] over the k ordered pairs by which of their 2k
indices coincide; a pattern with m distinct indices contributes S_A S_B / (n)_m, (n)_m =
n(n-1)…(n-m+1), where S_X is X's sum over distinct indices for that pattern. By inclusion-
exclusion (Möbius inversion over merging indices) each S_X is a sum of unrestricted sums, and an
unrestricted sum vanishes whenever an index appears in one factor only (a zero row sum) or a
factor is diagonal; with three factors only Σ Ã_ij³ (c) and Σ Ã_ij Ã_jk Ã_ki (t) survive. Hence
``E[T] = 0``, ``Var T = 2 Q_A Q_B / (n(n-3))`` and, grouped by m (:data:`_THIRD`)::

    E[T³] = 4 c c'/(n)_2 + 8 (3cc' + tt')/(n)_3 + 8 (10cc' - 3ct' - 3tc' + 3tt')/(n)_4
            + 48 (t - 2c)(t' - 2c')/(n)_5 + 64 (t - 2c)(t' - 2c')/(n)_6
          = [4(n⁴-8n³+19n²-4n-16) cc' - 8(3n²-15n+16)(ct' + tc') + 8(n³-9n²+26n-22) tt'] / (n)_6

(primes: the other layer). Terms with m > n are absent (no m distinct indices exist), so the
per-m form also holds for batches of 4 and 5. With four factors the surviving unrestricted sums
are d = Σ Ã_ij⁴, e = Σ_i (Σ_j Ã_ij²)², f = Σ_ij Ã_ij² (Ã²)_ij, g = tr Ã⁴ and Q² (two disjoint
double edges), and ``E[T⁴] = Σ_m x M_m x'ᵀ / (n)_m`` with x = (Q², d, e, f, g) and the integer
matrices M_m of :data:`_FOURTH` (m = 2…8, found by enumerating the 4,140 partitions of the 8
indices). The fourth cumulant E[T⁴] - 3 Var² is what :mod:`analysis.inference.analytic_null` checks
the fit against. A test checks all four moments against every one of the n! permutations of
batches of 4 to 8.

**Biased estimator.** HSIC_b = ⟨A, B⟩ / (n-1)² with A = HKH, diagonal a, τ = Σ a_i, ã = a - τ/n.
Off the diagonal, A equals its U-centred version Ã plus terms of the form f(i) + f(j) + const,
which are orthogonal to every U-centred matrix; collecting terms gives, with λ = n/(n-2) and the
linear permutation statistic S(π) = Σ_i ã_i b̃_π(i),

    T_b(π) = T_u(π) + λ S(π) + τ_A τ_B / (n-1).

So the null mean of biased HSIC is τ_A τ_B / (n-1)³, not 0: the estimator's bias (Murphy,
Zylberberg & Fyshe 2024), reported as each cell's null mean. E[S] = E[T_u S] = 0, and by the same
pattern counting E[S²] = Σã²Σb̃²/(n-1), E[S³] = n Σã³Σb̃³/((n-1)(n-2)),
E[T_u² S] = 4(n-2) w w' / ((n-1)(n-3)(n-4)) with w = Σ_ij Ã_ij² ã_i, and
E[T_u S²] = 2 v v' / (n(n-3)) with v = ãᵀÃã. Then Var T_b = Var T_u + λ² E[S²] and
``κ₃ = E[T_u³] + 3λ E[T_u² S] + 3λ² E[T_u S²] + λ³ E[S³]``. Its fourth moment is not derived
here; the sums keep T_u's cumulants apart (:data:`SUMS`) for the tail check.

**Minibatches.** Each batch shuffles independently, so the batch statistics are independent and
their cumulants (mean, variance, third and fourth) add over batches; all cross-layer terms
above are products of per-layer numbers, so one batch adds a few outer products of length-L
vectors. The null CKA of a cell is its null HSIC over sqrt(HSIC_KK · HSIC_LL) (permuting both
sides of a Gram changes nothing), so its mean and standard deviation scale by that factor and its
skewness does not.

**The p-value.** A Pearson type III distribution with the null's mean, standard deviation and
skewness (as FactoMineR's ``coeffRV`` does for the RV coefficient, after Kazi-Aoual et al. 1995):
``p = P(null ≥ observed CKA)``. It is continuous, so there is no 1/(P+1) floor. Where the
fourth cumulant says the fit's tail is wrong, :mod:`analysis.inference.analytic_null` replaces it.

**Cost.** Q and c take O(n²) per layer; t = Σ_ij Ã_ij (Ã²)_ij needs one n×n matrix product per
layer, O(L·n³), in the Grams' precision: the only term that is not a by-product of the HSIC pass.
It cannot be had from Q and c (it is the one third-order invariant that sees how the Gram's
eigenvalues are spread), and a batched product of the L Grams is cheap next to forming them.
The fourth-order d, e, f, g are four more sums over n² entries of Ã, Ã∘Ã and Ã².
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from analysis.estimators.hsic import cka_from_hsic

__all__ = [
    "INVARIANTS",
    "SUMS",
    "NullMoments",
    "batch_moments",
    "layer_invariants",
    "moments_from_sums",
    "q_values",
    "u_centre",
]

# E[T_u³] grouped by the number m of distinct indices: (m, coefficient of cc', of ct' + tc',
# of tt'), each term divided by (n)_m. The m = 5 and 6 rows are 48 and 64 times
# (t - 2c)(t' - 2c') expanded.
_THIRD = (
    (2, 4.0, 0.0, 0.0),
    (3, 24.0, 0.0, 8.0),
    (4, 80.0, -24.0, 24.0),
    (5, 192.0, -96.0, 48.0),
    (6, 256.0, -128.0, 64.0),
)
# E[T_u² S] grouped the same way: coefficient of w w' over (n)_m, m = 2..5.
_MIXED = ((2, 4.0), (3, 20.0), (4, 52.0), (5, 64.0))
# E[T_u⁴] grouped the same way: (m, symmetric matrix M) with the term x M x'ᵀ / (n)_m, where
# x = (Q², d, e, f, g) of one layer and x' of the other (the fourth-order invariants of
# layer_invariants). The m = 7 and 8 terms are 96 and 144 times u u' with
# u = Q² + 24d - 24e - 32f + 4g, as the third moment's last terms are products.
_FOURTH = (
    (2, ((0, 0, 0, 0, 0), (0, 8, 0, 0, 0), (0, 0, 0, 0, 0), (0, 0, 0, 0, 0), (0, 0, 0, 0, 0))),
    (3, ((0, 0, 0, 0, 0), (0, 112, -48, 0, 0), (0, -48, 48, 0, 0), (0, 0, 0, 96, 0), (0,) * 5)),
    (
        4,
        (
            (12, 24, -48, 0, 0),
            (24, 832, -576, -288, 48),
            (-48, -576, 672, 192, -96),
            (0, -288, 192, 1056, 0),
            (0, 48, -96, 0, 48),
        ),
    ),
    (
        5,
        (
            (48, 192, -288, -96, 0),
            (192, 4416, -3744, -3840, 384),
            (-288, -3744, 4176, 3456, -576),
            (-96, -3840, 3456, 6528, -576),
            (0, 384, -576, -576, 192),
        ),
    ),
    (
        6,
        (
            (96, 864, -1008, -768, 96),
            (864, 18624, -17760, -22656, 2496),
            (-1008, -17760, 18480, 22080, -2784),
            (-768, -22656, 22080, 31104, -3840),
            (96, 2496, -2784, -3840, 576),
        ),
    ),
    (7, tuple(tuple(96 * a * b for b in (1, 24, -24, -32, 4)) for a in (1, 24, -24, -32, 4))),
    (8, tuple(tuple(144 * a * b for b in (1, 24, -24, -32, 4)) for a in (1, 24, -24, -32, 4))),
)
# The rows of a run's summed null cumulants (AnalyticNull.sums), each (L, L): mean, variance
# and third central moment of the estimator's null HSIC, then the variance, third and fourth
# cumulants of its U-statistic part, which the tail check reads (the same null for the
# unbiased estimator).
SUMS = ("mean", "var", "third", "var_u", "third_u", "fourth_u")
# Per-layer numbers, in this order, in the rows of layer_invariants.
_NAMES = ("Q", "c", "t", "tau", "q", "k", "w", "v", "d", "e", "f", "g")
INVARIANTS = len(_NAMES)


def _falling(n: int, m: int) -> float:
    """(n)_m = n (n-1) … (n-m+1)."""
    return float(np.prod(np.arange(n, n - m, -1, dtype=np.float64)))


@functools.lru_cache(maxsize=64)
def _fourth_table(n: int) -> np.ndarray:
    """Σ_m M_m / (n)_m over the terms of :data:`_FOURTH` that exist for a batch of n."""
    return sum(
        (np.array(table, dtype=np.float64) / _falling(n, m) for m, table in _FOURTH if m <= n),
        np.zeros((5, 5)),
    )


def u_centre(
    g: torch.Tensor,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    row_sums: torch.Tensor | None = None,
) -> torch.Tensor:
    """U-centred copies of Grams ``g`` (L, n, n): zero diagonal, every row summing to 0.

    ``Ã_ij = K_ij - r_i/(n-2) - r_j/(n-2) + s/((n-1)(n-2))`` for i ≠ j, with r the row sums and
    s the total of K with its diagonal zeroed (Székely & Rizzo 2014); written as
    ``K_ij - u_i - u_j`` with ``u = r/(n-2) - s/(2(n-1)(n-2))``, two passes in place. Any centring
    of K gives the same Ã. The copy, and the row sums, are in ``dtype`` (default: ``g``'s), or
    in ``out`` (a buffer of g's shape, reused). ``row_sums`` (L, n): g's row sums, diagonal
    included, where the caller has them (the engine's :func:`analysis.estimators.hsic.
    centred_rows` does): then r is taken from them in their precision instead of a pass over
    the copy. Needs n ≥ 3.
    """
    n = g.shape[-1]
    k = g.to(dtype or g.dtype, copy=True) if out is None else out.copy_(g)
    k.diagonal(dim1=-2, dim2=-1).zero_()
    r = k.sum(-1) if row_sums is None else row_sums - g.diagonal(dim1=-2, dim2=-1)
    u = (r / (n - 2) - (r.sum(-1, keepdim=True) / (2 * (n - 1) * (n - 2)))).to(k.dtype)
    k -= u[..., :, None]
    k -= u[..., None, :]
    k.diagonal(dim1=-2, dim2=-1).zero_()
    return k


def layer_invariants(
    centred: torch.Tensor,
    estimator: str,
    dtype: torch.dtype = torch.float64,
    work: torch.Tensor | None = None,
    row_sums: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-layer numbers of one batch (float64, (L, 12), columns as :data:`_NAMES`).

    ``centred`` (L, n, n): the batch's double-centred Grams HKH as :func:`analysis.estimators.hsic.
    centred_rows` gives them (diagonal zeroed for the unbiased estimator, kept for the biased
    one). Q, c, t and d, e, f, g are those of the U-centred Grams; the diagonal terms (tau,
    q = Σã², k = Σã³, w, v) are zero for the unbiased estimator. ``dtype``: the precision of
    the U-centred copy, its products and their sums over n² entries; the engine passes its
    Grams' (float32: a relative error of ~1e-6 in the moments, far below the permutation
    noise they replace, and no float64 copy of the stack). ``work``: a buffer (L, 3, n, n) in
    ``dtype`` for Ã, Ã∘Ã and Ã², reused from batch to batch (fresh ones of a few MB each cost
    the kernel's page zeroing every time: about as much as the sums themselves); Ã stays in
    ``work[:, 0]``. The sums of products of the three come from one batched product of the
    (2, n²) rows of Ã∘Ã and Ã² with the (3, n²) rows of all three, which reads each once (six
    separate dot products read them twelve times and took 3.5 times as long); the row sums of
    Ã∘Ã are the diagonal of Ã² (Ã is symmetric), so Q = tr Ã² needs no product of its own.
    ``row_sums``: the Grams' row sums where the caller has them (see :func:`u_centre`).
    """
    n_layers, n, _ = centred.shape
    out = torch.zeros(n_layers, len(_NAMES), dtype=torch.float64, device=centred.device)
    if n >= 4:
        if work is None:
            work = torch.empty(n_layers, 3, n, n, dtype=dtype, device=centred.device)
        a, sq, square = work[:, 0], work[:, 1], work[:, 2]
        u_centre(centred, dtype, a, row_sums)
        torch.mul(a, a, out=sq)
        torch.bmm(a, a, out=square)
        rows = work.view(n_layers, 3, n * n)
        # rows 1, 2 (Ã∘Ã, Ã²) against rows 0, 1, 2 (Ã, Ã∘Ã, Ã²): (L, 2, 3)
        dots = torch.bmm(rows[:, 1:], rows.transpose(1, 2)).to(torch.float64)
        out[:, 1], out[:, 2] = dots[:, 0, 0], dots[:, 1, 0]  # c, t
        out[:, 8], out[:, 10], out[:, 11] = dots[:, 0, 1], dots[:, 1, 1], dots[:, 1, 2]  # d, f, g
        # Σ_j Ã_ij², for Q, e and w: the diagonal of Ã² (Ã is symmetric), no pass over Ã∘Ã
        row_sq = square.diagonal(dim1=1, dim2=2).to(torch.float64)
        out[:, 0] = row_sq.sum(1)
        out[:, 9] = (row_sq**2).sum(1)
    if estimator == "biased" and n >= 3:
        d = centred.diagonal(dim1=1, dim2=2).to(torch.float64)
        tau = d.sum(1)
        dc = d - tau[:, None] / n
        out[:, 3], out[:, 4], out[:, 5] = tau, (dc**2).sum(1), (dc**3).sum(1)
        if n >= 4:
            out[:, 6] = (row_sq * dc).sum(1)
            out[:, 7] = torch.einsum("li,lij,lj->l", dc, a.to(torch.float64), dc)
    elif estimator == "biased":  # n = 2: T_b is the same for both permutations
        out[:, 3] = centred.diagonal(dim1=1, dim2=2).sum(1)
    return out


def batch_moments(inv: np.ndarray, n: int, estimator: str) -> np.ndarray:
    """One batch's null cumulants per cell, (len(:data:`SUMS`), L, L), rows as SUMS names them.

    ``inv``: :func:`layer_invariants` of the batch's L layers; cell (i, j) permutes layer j's
    samples against layer i's (the moments are symmetric in i, j). The last three rows are
    the cumulants of the U-statistic part T_u in the estimator's units (for the unbiased
    estimator the whole null; for the biased one its off-diagonal part, see the module doc).
    """
    col = {name: inv[:, k] for k, name in enumerate(_NAMES)}
    outer = np.outer
    Q, c, t = col["Q"], col["c"], col["t"]
    out = np.zeros((len(SUMS), len(Q), len(Q)))
    mean, var, third, var_u, third_u, fourth_u = out
    if n >= 4:
        var += 2 * outer(Q, Q) / (n * (n - 3))
        for m, cc, ct, tt in _THIRD:
            if m <= n:
                pairs = cc * outer(c, c) + ct * (outer(c, t) + outer(t, c)) + tt * outer(t, t)
                third += pairs / _falling(n, m)
        x = np.stack([Q**2, col["d"], col["e"], col["f"], col["g"]])
        fourth_u += x.T @ _fourth_table(n) @ x
        fourth_u -= 3 * var**2  # E[T_u⁴] - 3 Var², the fourth cumulant (E[T_u] = 0)
        var_u += var
        third_u += third
    if estimator == "biased":
        tau = col["tau"]
        mean += outer(tau, tau) / (n - 1)
    if estimator == "biased" and n >= 3:
        lam = n / (n - 2)
        q, k, w, v = col["q"], col["k"], col["w"], col["v"]
        var += lam**2 * outer(q, q) / (n - 1)
        third += lam**3 * n * outer(k, k) / ((n - 1) * (n - 2))
        if n >= 4:
            mixed = sum(coef / _falling(n, m) for m, coef in _MIXED if m <= n)
            third += 3 * lam * mixed * outer(w, w) + 3 * lam**2 * 2 * outer(v, v) / (n * (n - 3))
    scale = float(n * (n - 3) if estimator == "unbiased" else (n - 1) ** 2)
    for row, power in zip(out, (1, 2, 3, 2, 3, 4), strict=True):
        row /= scale**power
    return out


@dataclass(frozen=True)
class NullMoments:
    """Per cell (L, L): the null CKA's mean, standard deviation and skewness, and how far the
    tails depart from the Pearson type III fitted to them: the null's exact excess kurtosis
    minus the fit's, 1.5 skew² (of the U-statistic part, see :data:`SUMS`)."""

    mean: np.ndarray
    sd: np.ndarray
    skew: np.ndarray
    departure: np.ndarray

    def p_values(self, observed: np.ndarray) -> np.ndarray:
        """P(null ≥ observed) under the Pearson type III with these moments; NaN where the
        observed CKA or the moments are undefined.

        A null without spread (sd 0, e.g. batches of 2) is a point: p is 1 at or below it.
        """
        from scipy import stats

        defined = np.isfinite(observed) & np.isfinite(self.mean) & np.isfinite(self.sd)
        mean, x = np.where(defined, self.mean, 0.0), np.where(defined, observed, 0.0)
        spread = defined & (self.sd > 0)
        sd, skew = np.where(spread, self.sd, 1.0), np.where(spread, self.skew, 0.0)
        p = np.where(spread, stats.pearson3.sf(x, skew, loc=mean, scale=sd), 1.0 * (x <= mean))
        return np.where(defined, p, np.nan)

    def quantile(self, level: float) -> np.ndarray:
        """The ``level`` quantile of the fitted null CKA (NaN where undefined)."""
        from scipy import stats

        defined = np.isfinite(self.mean) & np.isfinite(self.sd)
        mean = np.where(defined, self.mean, 0.0)
        spread = defined & (self.sd > 0)
        sd, skew = np.where(spread, self.sd, 1.0), np.where(spread, self.skew, 0.0)
        q = np.where(spread, stats.pearson3.ppf(level, skew, loc=mean, scale=sd), mean)
        return np.where(defined, q, np.nan)


def moments_from_sums(sums: np.ndarray, hsic: np.ndarray) -> NullMoments:
    """The null CKA's moments per cell from summed cumulants ``sums`` (rows :data:`SUMS`) of
    the null HSIC and the summed observed HSIC (its diagonal: each side's self-HSIC); NaN where
    the cell's CKA is undefined."""
    mean, var, third, var_u, third_u, fourth_u = sums
    d = np.diag(hsic)
    sd = np.sqrt(np.maximum(var, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        skew = np.where(sd > 0, third / np.where(sd > 0, sd, 1.0) ** 3, 0.0)
        spread = var_u > 0
        v = np.where(spread, var_u, 1.0)
        departure = np.where(spread, fourth_u / v**2 - 1.5 * third_u**2 / v**3, 0.0)
    sd_cka = cka_from_hsic(sd, d, d)
    undefined = np.isnan(sd_cka)
    return NullMoments(
        cka_from_hsic(mean, d, d),
        sd_cka,
        np.where(undefined, np.nan, skew),
        np.where(undefined, np.nan, departure),
    )


def q_values(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg q-values of the p-values ``p`` (any shape), NaN where p is NaN.

    Over the m finite p-values: ``q_(i) = min_{j ≥ i} p_(j) · m / j`` in ascending order,
    capped at 1, so q ≥ p and q is monotone in p. Rejecting where q ≤ α controls the false
    discovery rate at α for independent or positively dependent tests (Benjamini & Hochberg
    1995; Benjamini & Yekutieli 2001).
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    kept = p[ok]
    order = np.argsort(kept, kind="stable")
    ranked = kept[order] * len(kept) / np.arange(1, len(kept) + 1)
    out = np.empty_like(kept)
    out[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    q[ok] = out
    return q
