"""The streaming all-pairs CKA engine: K models, one forward pass each per batch.

Per batch, every selected layer of every model becomes a raw Gram (fp32, or float64 for a
float64 model), written into one (L_total, b, b) stack; :func:`analysis.hsic.hsic_from_grams`
turns the stack into the (L_total, L_total) HSIC terms of that batch with one matrix product,
and the only host transfer of the batch is that small float64 matrix. Terms are summed over
batches in float64, so memory does not grow with n (``bootstrap`` keeps the per-batch terms:
``batches × L_total²`` floats).

Batch plan (``minibatch``): fixed consecutive batches of ``batch_size`` in data order (a
DataLoader's own batches as they come). A batch smaller than the estimator's minimum (4
samples unbiased, 2 biased), normally a ragged last one, is dropped and reported in
``diagnostics["dropped_batches"]``; any other batch counts with weight one, as in Nguyen et
al. 2021. ``full`` mode keeps every feature and computes exact float64 HSIC over the whole
sample, via the feature-space identity for linear kernels when every layer has d < n, else
through n×n Grams: memory grows with n, so use it for a few thousand samples at most.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from analysis.atlas import Atlas
from analysis.bootstrap import bootstrap_intervals
from analysis.datasets import ImageDataset, load_dataset
from analysis.errors import AnalysisError, Cancelled, DatasetError, EstimatorError
from analysis.gram_cache import GramCache, gram_key
from analysis.hsic import (
    MIN_SAMPLES,
    check_estimator,
    cka_from_hsic,
    hsic_from_grams,
    hsic_linear_features,
    undefined_reasons,
)
from analysis.kernels import Kernel, gram, parse_kernel
from analysis.layers import FEATURE_POLICIES, LayerReader, LayerSelection, resolve_layers

__all__ = ["MODES", "cka_from_features", "compare"]

MODES = ("minibatch", "full")
DataLike = torch.Tensor | np.ndarray | ImageDataset | str | os.PathLike[str] | Iterable[Any]
_AMP = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16}
_AMP |= {"float16": torch.float16, "half": torch.float16}


@dataclass
class _Source:
    batches: Callable[[], Iterator[torch.Tensor]]
    total: int | None
    key: str | None  # a dataset identity known without work (sha256 of an ImageDataset, or given)
    array: torch.Tensor | np.ndarray | None = None

    def fingerprint(self) -> str | None:
        """The dataset identity, hashing an in-memory array once when none was given."""
        if self.key is None and self.array is not None:
            a = self.array
            a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
            self.key = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        return self.key


def _input(item: Any) -> torch.Tensor:
    if isinstance(item, dict):
        item = next((item[k] for k in ("x", "image", "images", "input") if k in item), None)
    elif isinstance(item, list | tuple) and item:
        item = item[0]
    if isinstance(item, np.ndarray):
        item = torch.from_numpy(np.array(item, dtype=np.float32))
    if not isinstance(item, torch.Tensor):
        raise DatasetError("each batch must be a tensor, or a tuple or dict whose first is one")
    return item


def _source(data: DataLike, batch_size: int, dataset_key: str | None) -> _Source:
    if isinstance(data, str | os.PathLike):
        data = load_dataset(os.fspath(data))
    if isinstance(data, ImageDataset):
        dataset_key = dataset_key or data.sha256
        data = data.x
    if isinstance(data, np.ndarray | torch.Tensor):
        arr = data
        if arr.ndim != 4:
            raise DatasetError(f"images must be shaped (N, C, H, W), not {tuple(arr.shape)}")
        n = int(arr.shape[0])

        def batches() -> Iterator[torch.Tensor]:
            for i in range(0, n, batch_size):
                part = arr[i : i + batch_size]
                # a copy per batch: the array may be read-only, and then no view may be shared
                yield part if isinstance(part, torch.Tensor) else torch.from_numpy(np.array(part))

        return _Source(batches, math.ceil(n / batch_size), dataset_key, arr)
    if isinstance(data, Iterable):
        loader = data
        total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
        return _Source(lambda: (_input(i) for i in loader), total, dataset_key)
    raise DatasetError(f"cannot read images from a {type(data).__name__}")


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
    """
    names = list(models)
    if not names:
        raise AnalysisError("no models to compare")
    kern = _validate(kernel, estimator, mode, batch_size)
    if feature not in FEATURE_POLICIES:
        raise EstimatorError(f"unknown feature policy {feature!r}; use 'flatten' or 'mean_tokens'")
    if bootstrap < 0 or (bootstrap and mode != "minibatch"):
        raise EstimatorError("bootstrap takes a replicate count >= 0 and needs minibatch mode")
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
    src = _source(data, batch_size, dataset_key)
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
    run = _Run(models, names, selected, readers, kern, estimator, dev, amp, progress, on_batch)
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
    atlas.diagnostics = run.diagnostics(atlas, bootstrap, seed)
    return atlas


def _jsonable(layers: Any) -> Any:
    if layers is None or isinstance(layers, str | int):
        return layers
    return list(layers)


class _Run:
    """The loop over batches and its bookkeeping, shared by both modes."""

    def __init__(
        self,
        models: Mapping[str, nn.Module],
        names: list[str],
        selected: dict[str, list[str]],
        readers: dict[str, LayerReader],
        kern: Kernel,
        estimator: str,
        dev: torch.device,
        amp: torch.dtype | None,
        progress: bool,
        on_batch: Callable[[int, int], bool | None] | None,
    ) -> None:
        self.names, self.readers, self.kern, self.estimator = names, readers, kern, estimator
        self.dev, self.amp, self.progress, self.on_batch = dev, amp, progress, on_batch
        self.selected = selected
        self.offsets: dict[str, int] = {}
        total = 0
        for m in names:
            self.offsets[m] = total
            total += len(selected[m])
        self.total_layers = total
        wide = any(p.dtype == torch.float64 for m in names for p in models[m].parameters())
        self.gdtype = torch.float64 if wide else torch.float32
        self.n = self.batches = self.hits = self.misses = 0
        self.dropped: list[dict[str, int]] = []
        self.forwards = dict.fromkeys(names, 0)
        self.cache_note = "off"

    def _features(self, m: str, x: torch.Tensor) -> list[torch.Tensor]:
        amp = torch.autocast(self.dev.type, dtype=self.amp) if self.amp else nullcontext()
        with amp:
            feats = self.readers[m](x)
        self.forwards[m] += 1
        return [f.to(self.gdtype) for f in feats]

    def _loop(self, src: _Source) -> Iterator[tuple[int, torch.Tensor]]:
        bar = tqdm(total=src.total, disable=not self.progress, desc="CKA", unit="batch")
        try:
            for i, x in enumerate(src.batches()):
                if x.shape[0] < MIN_SAMPLES[self.estimator]:
                    self.dropped.append({"batch": i, "size": int(x.shape[0])})
                else:
                    yield i, x
                bar.update(1)
                if self.on_batch is not None and self.on_batch(i + 1, src.total or 0) is False:
                    raise Cancelled(f"cancelled after {i + 1} batches")
        finally:
            bar.close()

    def minibatch(
        self,
        src: _Source,
        cache: GramCache | None,
        keys: Mapping[str, str],
        parts: dict[str, Any] | None,
        bootstrap: int,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        acc = np.zeros((self.total_layers, self.total_layers))
        per_batch: list[np.ndarray] = []
        buf: torch.Tensor | None = None
        with torch.inference_mode():
            for i, x in self._loop(src):
                b = int(x.shape[0])
                if buf is None or buf.shape[1] != b:
                    buf = torch.empty(self.total_layers, b, b, dtype=self.gdtype, device=self.dev)
                xd: torch.Tensor | None = None
                for m in self.names:
                    lo, hi = self.offsets[m], self.offsets[m] + len(self.selected[m])
                    key = None
                    if cache is not None and parts is not None and m in keys:
                        key = gram_key(
                            model=keys[m], batch=i, size=b, layers=self.selected[m], **parts
                        )
                        stored = cache.get(key)
                        if stored is not None and stored.shape == (hi - lo, b, b):
                            buf[lo:hi].copy_(torch.tensor(stored))
                            self.hits += 1
                            continue
                        self.misses += 1
                    if xd is None:
                        xd = x.to(self.dev, non_blocking=True)
                    for j, f in enumerate(self._features(m, xd)):
                        gram(f, self.kern, out=buf[lo + j])
                    if key is not None and cache is not None:
                        cache.put(key, buf[lo:hi].float().cpu().numpy())
                h = hsic_from_grams(buf, self.estimator).cpu().numpy()  # the batch's one transfer
                acc += h
                if bootstrap:
                    per_batch.append(h)
                self.n += b
                self.batches += 1
        if not self.batches:
            raise EstimatorError("no batch was large enough for the estimator; use more data")
        return acc, per_batch

    def full(self, src: _Source) -> np.ndarray:
        parts: list[list[torch.Tensor]] = [[] for _ in range(self.total_layers)]
        with torch.inference_mode():
            for _, x in self._loop(src):
                xd = x.to(self.dev, non_blocking=True)
                for m in self.names:
                    for j, f in enumerate(self._features(m, xd)):
                        parts[self.offsets[m] + j].append(f)
                self.n += int(x.shape[0])
                self.batches += 1
            if self.n < MIN_SAMPLES[self.estimator]:
                raise EstimatorError(
                    f"{self.n} samples are too few for the {self.estimator} estimator"
                )
            xs = [torch.cat(p).to(torch.float64) for p in parts]
            return _full_hsic(xs, self.kern, self.estimator).cpu().numpy()

    def diagnostics(self, atlas: Atlas, bootstrap: int, seed: int) -> dict[str, Any]:
        owners = [(m, name) for m in self.names for name in self.selected[m]]
        undefined = [
            {"model": owners[i][0], "layer": owners[i][1], "reason": why}
            for i, why in sorted(undefined_reasons(atlas.hsic).items())
        ]
        negative = []
        for a, b in atlas.pairs():
            cka = atlas.matrix(a, b)
            count = int(np.sum(np.nan_to_num(cka, nan=0.0) < 0))
            if count:
                negative.append({"a": a, "b": b, "count": count, "min": float(np.nanmin(cka))})
        return {
            "n_used": self.n,
            "batches": self.batches,
            "dropped_batches": self.dropped,
            "dropped_samples": sum(d["size"] for d in self.dropped),
            "forward_passes": self.forwards,
            "gram_cache": {"mode": self.cache_note, "hits": self.hits, "misses": self.misses},
            "undefined_layers": undefined,
            "negative_cells": negative,
            "bootstrap": {"replicates": bootstrap, "seed": seed, "level": 0.95}
            if bootstrap
            else None,
        }


def _full_hsic(xs: list[torch.Tensor], kern: Kernel, estimator: str) -> torch.Tensor:
    n = xs[0].shape[0]
    if kern.name == "linear" and all(x.shape[1] < n for x in xs):
        return hsic_linear_features(xs, estimator)
    return hsic_from_grams(torch.stack([gram(x, kern) for x in xs]), estimator)


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
        h = _full_hsic([f.to(torch.float64) for f in feats], kern, estimator).cpu().numpy()
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
