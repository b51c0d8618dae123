"""The streaming all-pairs CKA engine: K models, one forward pass each per batch.

:func:`compare` validates its arguments, resolves every model's layers before any forward
pass, and hands the loop to :class:`analysis.streaming.StreamingRun`. Per batch, every
selected layer of every model becomes a raw Gram (fp32, or float64 for a float64 model); one
matrix product over the stacked centred Grams gives the (L_total, L_total) HSIC terms of the
batch (with the Gram store, one product per pair of models, so stored pairs are reused), and
the only host transfer of the batch is that small float64 matrix. Terms are
summed over batches in float64, so memory does not grow with n (``bootstrap`` keeps the
per-batch terms: ``batches × L_total²`` floats).

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
from analysis.bootstrap import bootstrap_intervals
from analysis.calibration import PermutationNull
from analysis.errors import AnalysisError, EstimatorError
from analysis.flags import calibration_flags
from analysis.gram_cache import GramCache
from analysis.hsic import MIN_SAMPLES, check_estimator, cka_from_hsic, hsic_from_grams
from analysis.kernels import Kernel, gram, parse_kernel
from analysis.layers import FEATURE_POLICIES, LayerReader, LayerSelection, resolve_layers
from analysis.sources import DataLike, batch_source
from analysis.spectrum import SpectrumAccumulator
from analysis.streaming import StreamingRun, full_hsic

__all__ = ["MODES", "cka_from_features", "compare"]

MODES = ("minibatch", "full")
_AMP = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16}
_AMP |= {"float16": torch.float16, "half": torch.float16}


def _amp_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or dtype in ("fp32", "float32", torch.float32):
        return None
    if isinstance(dtype, str):
        if dtype not in _AMP:
            raise EstimatorError(f"unknown dtype {dtype!r}; use 'bf16', 'fp16' or 'fp32'")
        return _AMP[dtype]
    if dtype not in (torch.bfloat16, torch.float16):
        raise EstimatorError(f"autocast dtype must be bfloat16 or float16, not {dtype}")
    return dtype


def _validate(kernel: str | Kernel, estimator: str, mode: str, batch_size: int) -> Kernel:
    kern = parse_kernel(kernel)
    check_estimator(estimator)
    if mode not in MODES:
        raise EstimatorError(f"unknown mode {mode!r}; use 'minibatch' or 'full'")
    if batch_size < MIN_SAMPLES[estimator]:
        raise EstimatorError(
            f"the {estimator} estimator needs batches of at least {MIN_SAMPLES[estimator]} samples"
        )
    return kern


def compare(
    models: Mapping[str, nn.Module],
    data: DataLike,
    *,
    layers: LayerSelection | Mapping[str, LayerSelection | None] | None = None,
    kernel: str | Kernel = "linear",
    estimator: str = "unbiased",
    mode: str = "minibatch",
    batch_size: int = 256,
    feature: str = "flatten",
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    bootstrap: int = 0,
    progress: bool = False,
    gram_cache: GramCache | None = None,
    model_keys: Mapping[str, str] | None = None,
    on_batch: Callable[[int, int], bool | None] | None = None,
    dataset_key: str | None = None,
    seed: int = 0,
    permutations: int = 0,
    sensitivity: bool = False,
) -> Atlas:
    """CKA between every selected layer of every pair of ``models`` (each with itself too).

    ``data``: a tensor or array (N, C, H, W), an :class:`ImageDataset`, a dataset spec for
    :func:`analysis.load_dataset`, or an iterable of batches (e.g. a DataLoader, whose own
    batches are used). ``layers``: one selection for every model, or a mapping from model name
    to selection (see :mod:`analysis.layers`). ``dtype`` (``"bf16"``/``"fp16"``) autocasts the
    forward pass; Grams stay fp32. ``bootstrap=B`` adds 95 % percentile intervals from B
    minibatch resamples (seeded with ``seed``). ``gram_cache`` with ``model_keys`` (a stable
    identity per model, e.g. its checkpoint sha256) reuses stored Grams instead of running a
    model; ``dataset_key`` names a DataLoader's data for that purpose (tensors and datasets
    are hashed). ``on_batch(done, total)`` is called after every batch (``total`` is 0 when
    unknown); returning False stops with :class:`analysis.Cancelled`. Models are moved to
    ``device`` (default: CUDA if available) and run in eval mode; their mode is restored.

    Calibration (minibatch mode): ``permutations=P`` adds a permutation null per cell from
    the same Grams (p-values, null mean and 95 % quantile, seeded with ``seed``; see
    :mod:`analysis.calibration`), ``sensitivity=True`` CKA with each side's top principal
    component removed; either also records per-layer effective dimension and top-component
    share, and warnings (:mod:`analysis.flags`) in ``diagnostics``.
    """
    names = list(models)
    if not names:
        raise AnalysisError("no models to compare")
    kern = _validate(kernel, estimator, mode, batch_size)
    if feature not in FEATURE_POLICIES:
        raise EstimatorError(f"unknown feature policy {feature!r}; use 'flatten' or 'mean_tokens'")
    if bootstrap < 0 or (bootstrap and mode != "minibatch"):
        raise EstimatorError("bootstrap takes a replicate count >= 0 and needs minibatch mode")
    if permutations < 0 or ((permutations or sensitivity) and mode != "minibatch"):
        raise EstimatorError("permutations (>= 0) and sensitivity need minibatch mode")
    amp = _amp_dtype(dtype)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    per_model = isinstance(layers, Mapping)
    selected = {
        m: resolve_layers(
            models[m],
            layers.get(m) if isinstance(layers, Mapping) else layers,
            model_name=f"model {m!r}",
        )
        for m in names
    }
    readers = {m: LayerReader(models[m], selected[m], feature) for m in names}
    src = batch_source(data, batch_size, dataset_key)
    config: dict[str, Any] = {
        "kernel": kern.spec,
        "estimator": estimator,
        "mode": mode,
        "batch_size": batch_size,
        "feature": feature,
        "layers": {m: selected[m] for m in names} if per_model else _jsonable(layers),
        "device": str(dev),
        "dtype": None if amp is None else str(amp).removeprefix("torch."),
        "bootstrap": bootstrap,
        "seed": seed,
    }
    if permutations or sensitivity:
        config |= {"permutations": permutations, "sensitivity": sensitivity}
    run = StreamingRun(models, selected, readers, kern, estimator, dev, amp, progress, on_batch)
    _calibration(run, permutations, sensitivity, seed)
    training = {m: models[m].training for m in names}
    try:
        for m in names:
            models[m].to(dev).eval()
        if mode == "full":
            h, per_batch = run.full(src), None
        else:
            cache_parts = None
            if gram_cache is not None and model_keys:
                fp = src.fingerprint()
                if fp is not None:
                    cache_parts = {"dataset": fp, "plan": batch_size, "feature": feature}
                    cache_parts |= {"kernel": kern.spec, "dtype": config["dtype"]}
            run.cache_note = (
                "off"
                if gram_cache is None
                else "on"
                if cache_parts
                else "skipped: no model_keys or no dataset fingerprint (pass dataset_key)"
            )
            h, per_batch = run.minibatch(src, gram_cache, model_keys or {}, cache_parts, bootstrap)
    finally:
        for m in names:
            models[m].train(training[m])
    ci_low = ci_high = None
    if bootstrap and per_batch is not None and len(per_batch):
        ci_low, ci_high = bootstrap_intervals(np.stack(per_batch), bootstrap, seed)
    config["dataset"] = src.key  # hashed only when the cache needed it
    atlas = Atlas(names, selected, h, run.n, config, {}, ci_low, ci_high)
    _finish_calibration(run, atlas)
    atlas.diagnostics = run.diagnostics(atlas, bootstrap, seed)
    if run.spectra is not None:
        warnings, flags = calibration_flags(atlas, run.n / max(run.batches, 1))
        atlas.diagnostics |= {"warnings": warnings, "flags": flags}
    return atlas


def _calibration(run: StreamingRun, permutations: int, sensitivity: bool, seed: int) -> None:
    """Attach the permutation null and the spectra accumulators to ``run`` when asked for."""
    sizes = [len(run.selected[m]) for m in run.names]
    if permutations:
        # the trace term in the Grams' precision: float32, or float64 for a float64 model
        run.null = PermutationNull(sizes, permutations, seed, run.estimator, run.dev, run.gdtype)
    if permutations or sensitivity:
        run.spectra = SpectrumAccumulator(sum(sizes), run.estimator, sensitivity)


def _finish_calibration(run: StreamingRun, atlas: Atlas) -> None:
    """Move the run's null summary, spectra and deflated CKA into ``atlas``."""
    if run.null is not None:
        atlas.null, _ = run.null.summary(atlas.hsic)
    if run.spectra is None:
        return
    pr, share = run.spectra.means()
    atlas.layer_effective_dim, atlas.layer_top_share = pr.numpy(), share.numpy()
    if run.spectra.sensitivity:
        cross = run.spectra.deflated_cross.numpy()
        own = run.spectra.deflated_self.numpy()
        d = np.diag(atlas.hsic)
        with np.errstate(invalid="ignore", divide="ignore"):
            drop = cross / np.sqrt(np.outer(own, d))
        drop[~np.isfinite(atlas.cka)] = np.nan
        atlas.cka_drop = np.where(np.isfinite(drop), drop, np.nan)


def _jsonable(layers: Any) -> Any:
    if layers is None or isinstance(layers, str | int):
        return layers
    return list(layers)


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
    kern = _validate(kernel, estimator, mode, batch_size)
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
        h = np.zeros((len(feats), len(feats)))
        wide = torch.float64 if any(f.dtype == torch.float64 for f in feats) else torch.float32
        used = 0
        for i in range(0, n, batch_size):
            if min(batch_size, n - i) < MIN_SAMPLES[estimator]:
                continue
            grams = torch.stack([gram(f[i : i + batch_size].to(wide), kern) for f in feats])
            h += hsic_from_grams(grams, estimator).cpu().numpy()
            used += 1
        if not used:
            raise EstimatorError("no batch was large enough for the estimator; use more data")
    return cka_from_hsic(h)[: len(xs), len(xs) :]
