"""The streaming all-pairs CKA engine: K models, one forward pass each per batch.

:func:`compare` validates its options as one :class:`analysis.CompareOptions` and hands them
to :class:`analysis.streaming.StreamingRun`, which resolves every model's layers before any
forward pass and runs the loop. Per batch, every selected layer of every model becomes a raw
Gram (fp32, or float64 for a float64 model); one matrix product over the stacked centred Grams
gives the (L_total, L_total) HSIC terms of the batch (with the Gram store, one product per pair
of models, so stored pairs are reused), and the only host transfer of the batch is that small
float64 matrix. Terms are summed over batches in float64, so memory does not grow with n
(``bootstrap`` keeps the per-batch terms: ``batches × L_total²`` floats).

A comparison is :func:`analysis.partial.combine` of one :class:`analysis.partial.Partial`
over the whole batch plan; the plan can also be run in ranges of batches on different
workers and combined to the same atlas (:mod:`analysis.partial`).

Batch plan (``minibatch``): fixed consecutive batches of ``batch_size`` in data order (a
DataLoader's own batches as they come). A batch smaller than the estimator's minimum (4
samples unbiased, 2 biased), normally a ragged last one, is dropped and reported in
``diagnostics["dropped_batches"]``; any other batch counts with weight one, as in Nguyen et
al. 2021. ``full`` mode keeps every feature and computes exact float64 HSIC over the whole
sample, via the feature-space identity for linear kernels when every layer has d < n, else
through n×n Grams: memory grows with n, so use it for a few thousand samples at most.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.atlas import Atlas
from analysis.batches import sum_batches
from analysis.errors import EstimatorError
from analysis.gram_cache import GramCache
from analysis.hsic import MIN_SAMPLES, cka_from_hsic, hsic_from_grams
from analysis.kernels import Kernel, gram
from analysis.options import CompareOptions
from analysis.partial import combine, run_partial
from analysis.sources import DataLike
from analysis.streaming import RunSettings, full_hsic

__all__ = ["cka_from_features", "compare"]


def compare(
    models: Mapping[str, nn.Module],
    data: DataLike,
    options: CompareOptions | None = None,
    *,
    device: str | torch.device | None = None,
    progress: bool = False,
    gram_cache: GramCache | None = None,
    model_keys: Mapping[str, str] | None = None,
    on_batch: Callable[[int, int], bool | None] | None = None,
    dataset_key: str | None = None,
    **shortcuts: Any,
) -> Atlas:
    """CKA between every selected layer of every pair of ``models`` (each with itself too).

    ``options`` (:class:`analysis.CompareOptions`) says what to compute; keyword
    ``shortcuts`` named like its fields (``kernel="rbf"``, ``batch_size=64``, …) build it, or
    override fields of ``options``; an invalid value raises :class:`analysis.OptionsError`.
    ``data``: a tensor or array (N, C, H, W), an :class:`ImageDataset`, a dataset spec for
    :func:`analysis.load_dataset`, or an iterable of batches (e.g. a DataLoader, whose own
    batches are used). Every model reads the same images in the same order through its own
    input pipeline (``model.atlas_preprocessing``, set by :func:`models.load`): image files
    (an ImageFolder, of any sizes and modes) are decoded and resized, cropped and normalised
    per model; arrays must have the model's input shape and are normalised. ``dtype``
    (``"bf16"``/``"fp16"``) autocasts the forward pass; Grams
    stay fp32. ``bootstrap=B`` adds 95 % percentile intervals from B minibatch resamples
    (seeded with ``seed``).

    The rest is plumbing. ``gram_cache`` with ``model_keys`` (a stable identity per model,
    e.g. its checkpoint sha256) reuses stored Grams instead of running a model;
    ``dataset_key`` names a DataLoader's data for that purpose (tensors and datasets are
    hashed). ``on_batch(done, total)`` is called after every batch (``total`` is 0 when
    unknown); returning False stops with :class:`analysis.Cancelled`. Models are moved to
    ``device`` (default: CUDA if available) and run in eval mode; their mode is restored.

    Calibration (minibatch mode): ``permutations=P`` adds a permutation null per cell from
    the same Grams (p-values, null mean and 95 % quantile, seeded with ``seed``; see
    :mod:`analysis.calibration`), ``sensitivity=True`` CKA with each side's top principal
    component removed; either also records per-layer effective dimension and top-component
    share, and warnings (:mod:`analysis.flags`) in ``diagnostics``.
    """
    settings = RunSettings(device, progress, gram_cache, model_keys, on_batch, dataset_key)
    opts = CompareOptions.build(options, **shortcuts)
    return combine([run_partial(models, data, opts, None, settings)])


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
