"""``cka_test``: CKA between two feature matrices with its p-value under the permutation null.

The same null as an atlas cell: within each batch the samples of one side are shuffled. By
default its exact moments give the p-value in closed form (:mod:`analysis.inference.null_moments`);
with ``permutations=P`` the minibatch HSIC is recomputed from the Grams for P shuffles instead
(:mod:`analysis.inference.permutation_null`). With ``batch_size=None`` the whole sample is one
batch, which is the classical permutation test of CKA (exact float64 HSIC over all n samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from analysis.errors import EstimatorError
from analysis.estimators.batches import sum_batches
from analysis.estimators.hsic import (
    MIN_SAMPLES,
    centred_rows,
    check_estimator,
    cka_from_hsic,
    hsic_block,
)
from analysis.estimators.kernels import Kernel, gram, parse_kernel
from analysis.inference.analytic_null import AnalyticNull
from analysis.inference.null_draws import KEEP_BYTES
from analysis.inference.permutation_null import PermutationNull
from analysis.options import CompareOptions

__all__ = ["CKATest", "cka_test"]


@dataclass(frozen=True)
class CKATest:
    """Observed CKA, its one-sided p-value, and the null's mean and 95 % quantile.

    ``method``: the null asked for, ``analytic`` (exact moments; ``null`` is empty) or
    ``permutation`` (``null`` holds the P null CKA values and ``p_value`` is
    ``(1 + #{null ≥ cka}) / (1 + P)``). ``p_method`` says what the p-value rests on, as an
    atlas cell's does (:class:`analysis.inference.permutation_null.NullSummary`): with the analytic
    null, the fitted Pearson type III, or where its tail check fails a sequential Monte Carlo p
    (``draws`` permutations) or the moment bound. For the biased estimator ``null_mean`` is
    its bias.
    """

    cka: float
    p_value: float
    null_mean: float
    null_q95: float
    permutations: int
    null: np.ndarray
    method: str = "permutation"
    p_method: str = "permutation"
    draws: int = 0


def _as_features(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    return t.reshape(t.shape[0], -1).to(torch.float64, copy=True).cpu()


def cka_test(
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    *,
    null: str = "analytic",
    permutations: int = 0,
    kernel: str | Kernel = "linear",
    estimator: str = "unbiased",
    seed: int = 0,
    batch_size: int | None = None,
) -> CKATest:
    """Permutation test of CKA between ``x`` (n, ...) and ``y`` (n, ...) over the same samples.

    ``batch_size`` splits the samples into consecutive batches as :func:`analysis.compare`
    does (a last batch below the estimator's minimum is dropped); None uses one batch.
    ``null`` and ``permutations`` are read as :class:`analysis.CompareOptions` reads them:
    ``permutations`` above 0 asks for that many shuffles; ``null="none"`` is refused here.
    """
    kern = parse_kernel(kernel)
    check_estimator(estimator)
    method = CompareOptions.build(null=null, permutations=permutations).null
    if method == "none":
        raise EstimatorError("cka_test needs a null: use null 'analytic' or 'permutation'")
    fx, fy = _as_features(x), _as_features(y)
    n = fx.shape[0]
    if fy.shape[0] != n:
        raise EstimatorError(f"x has {n} samples and y {fy.shape[0]}; they must be the same")
    size = n if batch_size is None else batch_size
    least = MIN_SAMPLES[estimator]
    if size < least:
        raise EstimatorError(f"the {estimator} estimator needs at least {least} samples")
    # two "models" of one layer each; small problems, so the null runs in float64
    cpu = torch.device("cpu")
    analytic = AnalyticNull(2, estimator, keep=KEEP_BYTES)
    shuffled = None
    if method == "permutation":
        shuffled = PermutationNull([1, 1], permutations, seed, estimator, cpu, torch.float64)

    def step(batch: int, i: int) -> np.ndarray:
        grams = torch.stack([gram(fx[i : i + size], kern), gram(fy[i : i + size], kern)])
        rows = centred_rows(grams, estimator)
        if shuffled is None and kern.name == "linear":
            analytic.keep_features(batch, 0, fx[i : i + size])
            analytic.keep_features(batch, 1, fy[i : i + size])
        if shuffled is None:
            analytic.add(rows[0].view(2, grams.shape[1], grams.shape[1]), batch=batch)
        else:
            shuffled.add(rows, batch=batch)  # batch 0 alone when batch_size is None
        return hsic_block(rows, rows, estimator).numpy()

    starts = ((k, min(size, n - i), i) for k, i in enumerate(range(0, n, size)))
    sums = sum_batches(starts, estimator, step)
    sums.require()
    assert sums.hsic is not None
    h = sums.hsic
    hsic = (h + h.T) / 2
    if shuffled is None:
        summary, dist = analytic.summary(hsic, seed, sums.batches)[0], np.zeros((0, 2, 2))
    else:
        summary, dist = shuffled.summary(hsic)
    return CKATest(
        cka=float(cka_from_hsic(hsic)[1, 0]),
        p_value=float(summary.p_value[1, 0]),
        null_mean=float(summary.null_mean[1, 0]),
        null_q95=float(summary.null_q95[1, 0]),
        permutations=permutations,
        null=dist[:, 1, 0].copy(),
        method=method,
        p_method=str(summary.p_method[0, 1]) if summary.p_method is not None else method,
        draws=int(summary.p_draws[0, 1]) if summary.p_draws is not None else 0,
    )
