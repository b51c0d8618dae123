"""Percentile bootstrap over minibatches: how much CKA moves when the batches are resampled.

Each replicate draws as many batches as were used, with replacement, sums their per-batch HSIC
terms (kept in float64, (batches, L, L)) and normalises to CKA. The interval per cell is the
2.5th and 97.5th percentile over replicates (linear interpolation). A cell that is undefined
in any replicate (a resampled self-HSIC <= 0) gets no interval (NaN): its spread is not a
number. Memory: one (B, L, L) float64 array.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bootstrap_intervals"]


def bootstrap_intervals(
    per_batch: np.ndarray, replicates: int, seed: int, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) (L, L) percentile intervals of CKA from per-batch HSIC terms (nb, L, L)."""
    nb, n_layers, _ = per_batch.shape
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, nb, size=(replicates, nb))
    # counts[r, i]: how often replicate r drew batch i; one product gives every replicate's sum
    counts = np.zeros((replicates, nb))
    np.add.at(counts, (np.arange(replicates)[:, None], draws), 1.0)
    sums = (counts @ per_batch.reshape(nb, -1)).reshape(replicates, n_layers, n_layers)
    d = np.diagonal(sums, axis1=1, axis2=2)
    ok = np.isfinite(d) & (d > 0)
    d = np.where(ok, d, 1.0)
    cka = sums / np.sqrt(d[:, :, None] * d[:, None, :])
    valid = (ok[:, :, None] & ok[:, None, :] & np.isfinite(cka)).all(0)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(cka, [tail, 100 - tail], axis=0)
    low[~valid] = np.nan
    high[~valid] = np.nan
    return low, high
