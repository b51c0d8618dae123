"""CKA between feature matrices a caller already has, by the comparison's own estimators.

Exact in float64 over the whole sample (``mode="full"``), or summed over the batch plan a
comparison would use (``minibatch``, :func:`analysis.estimators.batches.sum_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from analysis.engine.streaming import full_hsic
from analysis.errors import EstimatorError
from analysis.estimators.batches import sum_batches
from analysis.estimators.hsic import MIN_SAMPLES, cka_from_hsic, hsic_from_grams
from analysis.estimators.kernels import Kernel, gram
from analysis.options import CompareOptions

__all__ = ["cka_from_features"]


def cka_from_features(
    xs: Sequence[torch.Tensor | np.ndarray],
    ys: Sequence[torch.Tensor | np.ndarray],
    *,
    kernel: str | Kernel = "linear",
    estimator: str = "unbiased",
    mode: str = "full",
    batch_size: int = 256,
) -> np.ndarray:
    """CKA (len(xs), len(ys)) between feature matrices (n, d_i) over the same n samples.

    ``full`` (the default here) is exact in float64; ``minibatch`` follows the same batch plan
    as :func:`compare`. NaN marks an undefined cell (a self-HSIC <= 0 or not finite).
    """
    opts = CompareOptions.build(
        kernel=kernel, estimator=estimator, mode=mode, batch_size=batch_size
    )
    kern, estimator = opts.parsed_kernel, opts.estimator
    feats = [torch.as_tensor(np.asarray(f) if not isinstance(f, torch.Tensor) else f) for f in xs]
    feats += [torch.as_tensor(np.asarray(f) if not isinstance(f, torch.Tensor) else f) for f in ys]
    feats = [f.detach().reshape(f.shape[0], -1) for f in feats]
    n = feats[0].shape[0] if feats else 0
    if not xs or not ys or any(f.shape[0] != n for f in feats):
        raise EstimatorError("xs and ys must be non-empty lists of arrays over the same samples")
    if mode == "full":
        if n < MIN_SAMPLES[estimator]:
            raise EstimatorError(f"{n} samples are too few for the {estimator} estimator")
        h = full_hsic([f.to(torch.float64) for f in feats], kern, estimator).cpu().numpy()
    else:
        wide = torch.float64 if any(f.dtype == torch.float64 for f in feats) else torch.float32

        def step(_: int, i: int) -> np.ndarray:
            grams = torch.stack([gram(f[i : i + batch_size].to(wide), kern) for f in feats])
            return hsic_from_grams(grams, estimator).cpu().numpy()

        starts = ((k, min(batch_size, n - i), i) for k, i in enumerate(range(0, n, batch_size)))
        sums = sum_batches(starts, estimator, step)
        sums.require()
        assert sums.hsic is not None
        h = sums.hsic
    return cka_from_hsic(h)[: len(xs), len(xs) :]
