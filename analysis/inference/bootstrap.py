"""Percentile bootstrap over minibatches: how much CKA moves when the batches are resampled.

Each replicate draws as many batches as were used, with replacement, sums their per-batch HSIC
terms (kept in float64, (batches, L, L)) and normalises to CKA. The interval per cell is the
2.5th and 97.5th percentile over replicates (linear interpolation). A cell that is undefined
in any replicate (a resampled self-HSIC <= 0) gets no interval (NaN): its spread is not a
number. Memory: one (B, L, L) float64 array.
"""

from __future__ import annotations

import numpy as np

from analysis.errors import OptionsError
from analysis.estimators.hsic import cka_from_hsic

__all__ = ["MIN_BOOTSTRAP_BATCHES", "bootstrap_intervals", "check_bootstrap_batches"]

# Fewer batches than this give a batch bootstrap too few distinct resamples to mean anything.
MIN_BOOTSTRAP_BATCHES = 20


def check_bootstrap_batches(batches: int) -> None:
    """Raise :class:`analysis.OptionsError` for a bootstrap over fewer than
    :data:`MIN_BOOTSTRAP_BATCHES` batches."""
    if batches < MIN_BOOTSTRAP_BATCHES:
        raise OptionsError(
            "interval",
            "too_few_batches",
            f"interval: a bootstrap over {batches} batches has too few distinct resamples "
            f"for its percentiles to mean anything (it needs at least "
            f"{MIN_BOOTSTRAP_BATCHES}); use interval='images', or smaller batches",
        )


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
    cka = cka_from_hsic(sums)
    tail = (1 - level) / 2 * 100
    # a cell undefined in any replicate is NaN in it, and so gets a NaN percentile
    low, high = np.percentile(cka, [tail, 100 - tail], axis=0)
    return low, high
