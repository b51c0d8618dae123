"""Permutation null of every CKA cell, from the per-batch Grams the engine already has.

**The null.** Unrelated layers would give the same statistic if the samples of one side were
shuffled. So, within every batch, the sample order of one side is permuted and the minibatch
HSIC is recomputed; the spread of the result over P permutations is the null distribution of
the cell, and no model runs again (Grams are functions of the features, and permuting samples
permutes Gram rows and columns: the Gram of the permuted features is ``Q L Qᵀ``).

**One batch, one permutation.** For Grams K, L of n samples, with K̃ = HKH with its diagonal
set to zero (:func:`analysis.estimators.hsic.centred_rows`), r_K = K̃1 and s_K = 1ᵀK̃1, the unbiased
estimator is ``[tr(K̃L̃) + s_K s_L/((n-1)(n-2)) - 2/(n-2) · r_K·r_L] / (n(n-3))``. Let π be a
permutation and Q its matrix, ``(QLQᵀ)_ij = L_π(i)π(j)``. Then, because QH = HQ and
``diag(QLQᵀ) = Q diag(L)``:

1. the zero-diagonal centred Gram of ``QLQᵀ`` is ``QL̃Qᵀ``: no Gram is centred again;
2. ``s`` sums every entry, so ``1ᵀQL̃Qᵀ1 = s_L``: the middle term does not change;
3. ``QL̃Qᵀ1 = Q r_L``, so ``1ᵀK̃QL̃Qᵀ1 = Σ_i r_K[i] r_L[π(i)]``: a dot of permuted row sums;
4. both matrices are symmetric with a zero diagonal, so
   ``tr(K̃QL̃Qᵀ) = Σ_{i≠j} K̃_ij L̃_π(i)π(j) = 2 Σ_{i<j} K̃_ij L̃_π(i)π(j)``: a gather of the
   m = n(n-1)/2 entries ``L̃_π(i)π(j)`` above the diagonal and a dot with K̃'s.

The biased estimator ``⟨HKH, HLH⟩/(n-1)²`` keeps the diagonal: its term is
``2 Σ_{i<j} K_ij L_π(i)π(j) + Σ_i K_ii L_π(i)π(i)`` (K, L centred here), and r = 0.

**Every cell at once.** Each model draws its own permutation per batch, shared by all its
layers (one shuffle of the samples, as if its forward pass had seen them in another order).
For model a, the gathered triangles of its L_a permuted layers, for a chunk of permutations,
form a matrix (m, P·L_a); one product with the unpermuted triangles of the layers of model a and
of every later model (rows) gives all those cells for all those permutations. A cell between
layers of models a < b is thus model a permuted against model b in its own order: the relative
order of two independently shuffled sides is uniform either way, so this is the null of both
cells (a, b) and (b, a), and each unordered cell is computed once (about L_total²/2 of them).
A cell of a model with itself pairs a permuted layer with an unpermuted one of the same model.

**Over batches.** Each batch has its own permutations, and the minibatch statistic sums the
per-batch terms, so the null HSIC of a cell for permutation p is the sum over batches of its
per-batch null terms. Permuting both sides of a Gram changes nothing, so each layer's
self-HSIC, the CKA denominator, is the observed one: null CKA = null HSIC / sqrt(HSIC_KK·HSIC_LL).

**Seeds.** Batch i draws its permutations from its own random stream,
``SeedSequence([seed, _STREAM, i])`` with i the batch's index in the whole plan (dropped
batches keep their index), so the null does not depend on which batches one process saw: a
comparison split into ranges of batches (:mod:`analysis.shards.shard`) sums to the null of the
unsplit run.

**Summary.** One-sided p-value with the +1 correction (Phipson & Smyth 2010):
``p = (1 + #{p : null_p ≥ observed}) / (1 + P)``, never 0; the smallest is 1/(1+P). Values
within :data:`TIE_TOLERANCE` below the observed CKA count as reaching it: the trace term runs
in float32, and rounding must not turn a tie (the identity permutation, say) into a smaller
p. Also the mean and the 95 % quantile (linear interpolation) of the null CKA per cell. For
the unbiased estimator the mean of HSIC over *all* permutations is exactly 0 (by 2.-4.,
``E[tr] = s_K s_L/(n(n-1))`` and ``E[r·r] = s_K s_L/n`` cancel the middle term), so a null
mean near 0 is expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from analysis.estimators.hsic import cka_from_hsic

__all__ = [
    "CHUNK_BYTES",
    "TIE_TOLERANCE",
    "NullSummary",
    "PermutationNull",
    "accumulate_null",
    "draw_permutations",
    "summarise_null",
]

# Null CKA values this close below the observed one count as reaching it (see the module doc).
# float32 rounding of the trace term moves a demo-atlas null CKA by ~1e-7.
TIE_TOLERANCE = 1e-6
# Size of the gather buffer of one chunk of permutations: big enough for an efficient product,
# small enough to stay in cache between the gather and the product.
CHUNK_BYTES = 8 * 2**20
# A separate random stream for permutations, so the bootstrap (same seed) draws do not move.
_STREAM = 0x5EED_CA1B


def draw_permutations(rng: np.random.Generator, count: int, n: int) -> np.ndarray:
    """``count`` independent uniform permutations of ``range(n)``, as rows (count, n)."""
    return rng.permuted(np.tile(np.arange(n, dtype=np.int64), (count, 1)), axis=1)


def _triangle(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    iu = torch.triu_indices(n, n, 1, device=device)
    return iu[0], iu[1]


def _pair_index(pi: torch.Tensor, i0: torch.Tensor, i1: torch.Tensor, n: int) -> torch.Tensor:
    """Flat indices ``π(i)·n + π(j)`` of the pairs i < j, position-major: row t·c + p holds
    pair t under permutation p, so the gather yields (m, c·L_k) directly. NumPy on the CPU
    (there its integer fancy indexing is ~10× torch's), torch on other devices."""
    if pi.device.type == "cpu":
        host = np.ascontiguousarray(pi.numpy().T, dtype=np.int32)  # n² < 2³¹ for any batch
        rows = host * np.int32(n)
        return torch.from_numpy((rows[i0.numpy()] + host[i1.numpy()]).reshape(-1))
    pt = pi.T
    return (pt.index_select(0, i0) * n + pt.index_select(0, i1)).reshape(-1)


def accumulate_null(
    out: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor],
    sizes: Sequence[int],
    perms: torch.Tensor,
    estimator: str,
    dtype: torch.dtype = torch.float32,
) -> None:
    """Add one batch's null HSIC of every cell, for every permutation, to ``out`` (P, L, L).

    ``rows``: :func:`analysis.estimators.hsic.centred_rows` of the batch's stacked Grams (F (L, n²),
    R (L, n), float64), models one after another with ``sizes[k]`` layers each; ``perms``
    (models, P, n): model k's permutations. Only the cells with the row's model at or after the
    column's are written (the rest is their mirror; :func:`summarise_null` fills it). The
    gather and the trace product run in ``dtype``; the rest in float64.
    """
    f, r = rows
    n_layers, n = r.shape
    count = perms.shape[1]
    i0, i1 = _triangle(n, f.device)
    m = i0.numel()
    tri = f.index_select(1, i0 * n + i1).to(dtype)  # (L, m): every layer's triangle, unpermuted
    s = r.sum(1)
    diag = f.view(n_layers, n, n).diagonal(dim1=1, dim2=2) if estimator == "biased" else None
    start = 0
    for k, size in enumerate(sizes):
        cols = slice(start, start + size)
        flat = f[cols].T.to(dtype).contiguous()  # (n², L_k): a gathered index copies L_k values
        chunk = max(1, CHUNK_BYTES // (m * size * flat.element_size()))
        buf = torch.empty(m * min(chunk, count), size, dtype=dtype, device=f.device)
        for c0 in range(0, count, chunk):
            pi = perms[k, c0 : c0 + chunk]  # (c, n)
            c = pi.shape[0]
            idx = _pair_index(pi, i0, i1, n)  # (m·c)
            y = torch.index_select(flat, 0, idx, out=buf[: m * c]).view(m, c * size)
            trace = 2 * (tri[start:] @ y).view(-1, c, size).to(torch.float64)  # (rows, c, L_k)
            rp = r[cols].index_select(1, pi.reshape(-1)).view(size, c, n)  # permuted row sums
            if estimator == "biased":
                assert diag is not None
                dp = diag[cols].index_select(1, pi.reshape(-1)).view(size, c, n)
                trace += torch.einsum("lcn,jn->jcl", dp, diag[start:])
                h = trace / (n - 1) ** 2
            else:
                rr = torch.einsum("lcn,jn->jcl", rp, r[start:])
                mid = torch.outer(s[start:], s[cols]) / ((n - 1) * (n - 2))
                h = (trace + mid[:, None, :] - (2 / (n - 2)) * rr) / (n * (n - 3))
            out[c0 : c0 + c, start:, cols] += h.permute(1, 0, 2)
        start += size


@dataclass(frozen=True)
class NullSummary:
    """Per cell (L, L): p-value, mean and 95 % quantile of the null CKA (NaN where undefined),
    and what each p-value rests on: ``p_method`` (``analytic``: the Pearson type III fitted to
    the exact moments, :mod:`analysis.inference.null_moments`; ``monte_carlo``: sequential
    permutations, :mod:`analysis.inference.null_draws`; ``bound``: the moment bound;
    ``permutation``: the brute-force null; empty where p is undefined) and ``p_draws`` (the
    permutations behind it, 0 for none). Both None in a summary read from an atlas that predates
    them."""

    p_value: np.ndarray
    null_mean: np.ndarray
    null_q95: np.ndarray
    p_draws: np.ndarray | None = None
    p_method: np.ndarray | None = None


def _kept(sizes: Sequence[int]) -> np.ndarray:
    """The cells whose null is kept: row's model after the column's, or the same model with
    row ≥ column (:func:`accumulate_null` writes both triangles of a model's own block)."""
    owner = np.repeat(np.arange(len(sizes)), sizes)
    later = owner[:, None] > owner[None, :]
    same = owner[:, None] == owner[None, :]
    idx = np.arange(len(owner))
    kept: np.ndarray = later | (same & (idx[:, None] >= idx[None, :]))
    return kept


def summarise_null(
    sums: np.ndarray, hsic: np.ndarray, sizes: Sequence[int], tolerance: float = TIE_TOLERANCE
) -> tuple[NullSummary, np.ndarray]:
    """The summary, and the null CKA (P, L, L), from accumulated null HSIC and observed HSIC.

    Within one model's block the written triangle (row ≥ column) is kept and mirrored.
    """
    full = np.where(_kept(sizes), sums, np.swapaxes(sums, 1, 2))
    d = np.diag(hsic)
    null = cka_from_hsic(full, d, d)  # both sides keep their observed self-HSIC
    observed = cka_from_hsic(hsic)
    valid = np.isfinite(observed)
    count = null.shape[0]
    exceed = (null >= observed - tolerance).sum(0)
    p = (1 + exceed) / (1 + count)
    mean = null.mean(0)
    q95 = np.quantile(null, 0.95, axis=0)
    for a in (p, mean, q95):
        a[~valid] = np.nan
    method = np.where(valid, "permutation", "").astype(object)
    return NullSummary(p, mean, q95, np.where(valid, count, 0), method), null


class PermutationNull:
    """Accumulates the permutation null of every cell over the batches of one run."""

    def __init__(
        self,
        sizes: Sequence[int],
        permutations: int,
        seed: int,
        estimator: str,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if permutations < 1:
            raise ValueError("a permutation null needs at least one permutation")
        self.sizes, self.permutations, self.estimator = list(sizes), permutations, estimator
        self.dtype, self.device, self.seed = dtype, device, seed
        total = sum(self.sizes)
        self.sums = torch.zeros(permutations, total, total, dtype=torch.float64, device=device)

    def add(self, rows: tuple[torch.Tensor, torch.Tensor], *, batch: int) -> None:
        """Batch number ``batch`` of the plan: its permutations for every model, in model order,
        from the batch's own stream (the same whichever batches were added before)."""
        n = rows[1].shape[1]
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _STREAM, batch]))
        perms = np.stack([draw_permutations(rng, self.permutations, n) for _ in self.sizes])
        pt = torch.from_numpy(perms).to(self.device)
        accumulate_null(self.sums, rows, self.sizes, pt, self.estimator, self.dtype)

    def summary(self, hsic: np.ndarray) -> tuple[NullSummary, np.ndarray]:
        """The summary against the run's accumulated HSIC, and the null CKA (P, L, L)."""
        return summarise_null(self.sums.cpu().numpy(), hsic, self.sizes)
