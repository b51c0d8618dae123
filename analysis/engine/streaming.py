"""The work of each batch behind :func:`analysis.compare`: Grams, HSIC terms, the Gram store.

The loop itself (small batches dropped, terms summed) is
:func:`analysis.estimators.batches.sum_batches`; every input of a run goes through the
:class:`StreamingRun` constructor.

Without the Gram store, every model runs once per batch, every selected layer becomes a raw
Gram written into one (L_total, b, b) stack, and all layer pairs of the batch come from one
matrix product over the stacked centred Grams (:func:`analysis.estimators.hsic.hsic_from_grams`).

With the store, each model either runs or, when the store has its Grams, is read back
without running, and the batch's HSIC matrix is built from one block per pair of models,
``hsic_block(rows_a, rows_b)``. Blocks are what makes stored Grams cheap: a block whose two
models' Grams were both stored was itself stored, so adding a model to a stored atlas costs
its forward pass, its Grams and its own blocks — not the whole atlas again. The pairs of a
batch are taken in the order of the models' Gram keys, whatever the order of the models, so
a stored block is bit for bit the one any run with the store would compute; a run without the
store (one product) can differ from it in the last bit. In both cases the only device-to-host
transfer of a batch is the assembled float64 matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from analysis.atlas import Atlas
from analysis.batch_statistics.analytic_null import AnalyticNullSums
from analysis.batch_statistics.kept_features import FeatureStatistic
from analysis.batch_statistics.protocol import Batch, BatchStatistic, Setup
from analysis.batch_statistics.registry import start_wanted
from analysis.data.decoded import DecodedCache
from analysis.data.sources import BatchSource
from analysis.engine.gram_cache import GramCache, gram_key
from analysis.errors import Cancelled, EstimatorError
from analysis.estimators.batches import BatchSums, sum_batches
from analysis.estimators.hsic import (
    MIN_SAMPLES,
    centred_rows,
    hsic_block,
    hsic_from_grams,
    hsic_linear_features,
    undefined_reasons,
)
from analysis.estimators.kernels import LOW_PRECISION, Kernel, gram
from analysis.inference.analytic_null import AnalyticNull, layers_to_keep
from analysis.inference.null_moments import INVARIANTS
from analysis.layers import LayerReader, resolve_layers
from analysis.options import CompareOptions

__all__ = ["RunSettings", "StreamingRun", "diagnostics", "full_hsic", "selected_layers"]

Rows = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class RunSettings:
    """Where and how a comparison runs, apart from what it computes (its
    :class:`analysis.CompareOptions`, which are recorded with the atlas and give the service its
    schema; these are not). ``device``: default CUDA if available. ``gram_cache`` with
    ``model_keys`` (a stable identity per model, e.g. its checkpoint sha256) reuses stored Grams;
    ``dataset_key`` names a DataLoader's data for that purpose. ``on_batch(done, total)`` after
    every batch; returning False cancels. ``decoded_cache``: where image files' pixels, decoded
    once per pipeline, are kept for the next comparison (:mod:`analysis.data.decoded`);
    ``gpu_jpeg``: its JPEG files decoded on the CUDA ``device`` (:mod:`analysis.data.gpu_jpeg`),
    where it can, under keys of their own."""

    device: str | torch.device | None = None
    progress: bool = False
    gram_cache: GramCache | None = None
    model_keys: Mapping[str, str] | None = None
    on_batch: Callable[[int, int], bool | None] | None = None
    dataset_key: str | None = None
    decoded_cache: DecodedCache | None = None
    gpu_jpeg: bool = False

    @property
    def torch_device(self) -> torch.device:
        """The device the models run on."""
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @classmethod
    def split(cls, kwargs: Mapping[str, Any]) -> tuple[RunSettings, dict[str, Any]]:
        """The settings named in ``kwargs`` (keyword arguments of a call), and the rest."""
        names = {f.name for f in fields(cls)}
        mine = {k: v for k, v in kwargs.items() if k in names}
        return cls(**mine), {k: v for k, v in kwargs.items() if k not in names}


def selected_layers(
    models: Mapping[str, nn.Module], options: CompareOptions
) -> dict[str, list[str]]:
    """Each model's layers as ``options.layers`` selects them (a bad selection fails here, before
    any forward pass)."""
    layers = options.layers
    return {
        m: list(
            resolve_layers(
                models[m],
                layers.get(m) if isinstance(layers, Mapping) else layers,
                model_name=f"model {m!r}",
            )
        )
        for m in models
    }


class StreamingRun:
    """One run of K models over a batch source, and its bookkeeping for the diagnostics."""

    def __init__(
        self,
        models: Mapping[str, nn.Module],
        options: CompareOptions,
        source: BatchSource,
        *,
        device: torch.device,
        inputs: Mapping[str, Callable[[Any], torch.Tensor]] | None = None,
        progress: bool = False,
        on_batch: Callable[[int, int], bool | None] | None = None,
        gram_cache: GramCache | None = None,
        model_keys: Mapping[str, str] | None = None,
    ) -> None:
        """Resolve every model's layers (a bad selection fails here, before any forward pass).

        ``source``: the batches of the plan. ``inputs``: each model's input from the raw batch
        (its pipeline), by name; a model without one reads the raw tensor. ``on_batch(done,
        total)`` is called after every batch; returning False cancels. ``gram_cache`` with
        ``model_keys`` (per model) reads and writes stored Grams and blocks in minibatch mode,
        when the source has a fingerprint (hashed only then).
        """
        self.options = options
        self.names = list(models)
        self.selected = selected_layers(models, options)
        self.readers = {
            m: LayerReader(models[m], self.selected[m], options.feature) for m in models
        }
        self.kern, self.estimator = options.parsed_kernel, options.estimator
        self.dev, self.amp = device, options.autocast
        self.progress, self.on_batch = progress, on_batch
        self.slices: dict[str, slice] = {}
        total = 0
        for m in self.names:
            self.slices[m] = slice(total, total + len(self.selected[m]))
            total += len(self.selected[m])
        self.total_layers = total
        wide = any(p.dtype == torch.float64 for m in self.names for p in models[m].parameters())
        self.gdtype = torch.float64 if wide else torch.float32
        self.sums = BatchSums()
        self.hits = self.misses = self.blocks_reused = self.blocks_computed = 0
        self.forwards = dict.fromkeys(self.names, 0)
        self.cache_note = "off"
        self.parts: dict[str, Any] = {}
        self.src, self.cache, self.keys = source, gram_cache, dict(model_keys or {})
        # what the run accumulates beside the HSIC sums (analysis.batch_statistics)
        sizes = [len(self.selected[m]) for m in self.names]
        setup = Setup(options, sizes, device, self.gdtype, source.total or 0)
        self.statistics: dict[str, BatchStatistic] = start_wanted(setup)
        # some are fed by the engine beside the batch: the analytic null per model from the
        # Gram store, and those that read the features (the sensitivity, the measures) each
        # layer's features as they are read, into one store they share
        analytic = self.statistics.get("analytic")
        self.analytic: AnalyticNull | None = (
            analytic.null if isinstance(analytic, AnalyticNullSums) else None
        )
        readers = [s for s in self.statistics.values() if isinstance(s, FeatureStatistic)]
        self.features = readers[0].kept if readers else None
        for reader in readers[1:]:
            reader.kept = readers[0].kept
        # with the store: (batch, size, model, Grams key) of the Grams not at hand, for the
        # models whose layers the tail check needs after all (:meth:`_keep_stored`)
        self.unkept: list[tuple[int, int, str, str]] = []
        self.inputs: dict[str, Callable[[Any], torch.Tensor]] = dict(inputs or {})

    @property
    def calibrating(self) -> bool:
        """Whether every batch needs every model's Grams, stored or not: for a statistic that
        reads them (the permutation null, the spectra, the image intervals; the analytic null
        needs only per-layer numbers, which the store keeps)."""
        return any(s.needs == "grams" for s in self.statistics.values())

    @property
    def centring(self) -> bool:
        """Whether a batch without the store needs its centred rows (for a statistic)."""
        return any(s.needs in ("grams", "rows") for s in self.statistics.values())

    def _update(self, batch: Batch, stored: bool = False) -> None:
        """Every statistic's update with one batch; ``stored``: through the Gram store, which
        feeds the analytic null itself (per model)."""
        for s in self.statistics.values():
            if not (stored and s.needs == "rows"):
                s.update(batch)

    def _per_model(self, raw: Any) -> Callable[[str], torch.Tensor]:
        """Model name -> its input for this raw batch, on the device; one per distinct pipeline.

        A tensor batch crosses to the device once and each pipeline normalises it there (on a
        GPU, normalising 224-pixel batches on the host and sending one copy per pipeline took
        longer than the forward passes); decoded images are made on the host and sent.
        """
        made: dict[str, torch.Tensor] = {}

        def get(m: str) -> torch.Tensor:
            fn = self.inputs.get(m)
            key = str(getattr(fn, "key", id(fn))) if fn is not None else "raw"
            if key not in made:
                if isinstance(raw, torch.Tensor):
                    if "raw" not in made:
                        made["raw"] = raw.to(self.dev, non_blocking=True)
                    made[key] = made["raw"] if fn is None else fn(made["raw"])
                else:
                    made[key] = fn(raw).to(self.dev, non_blocking=True) if fn else raw
            return made[key]

        return get

    def _features(self, m: str, x: torch.Tensor, low: bool = False) -> list[torch.Tensor]:
        """The selected layers' features of model ``m`` on input ``x``, in the Grams' dtype; with
        ``low``, bf16 and fp16 features of an autocast forward stay as they are (their Grams sum
        in float32: :func:`analysis.estimators.kernels.accumulator`), no float32 copy made."""
        amp = torch.autocast(self.dev.type, dtype=self.amp) if self.amp else nullcontext()
        with amp:
            feats = self.readers[m](x)
        self.forwards[m] += 1
        keep = low and self.gdtype == torch.float32
        return [f if keep and f.dtype in LOW_PRECISION else f.to(self.gdtype) for f in feats]

    def _grams(
        self, m: str, x: torch.Tensor, batch: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run model ``m`` on batch ``batch``: the raw Grams (L_m, b, b) of its layers, into
        ``out``."""
        b = x.shape[0]
        if out is None:
            out = torch.empty(len(self.selected[m]), b, b, dtype=self.gdtype, device=self.dev)
        analytic = self.analytic if self.kern.name == "linear" else None
        for j, low in enumerate(self._features(m, x, low=True)):
            gram(low, self.kern, out=out[j])
            narrow = analytic is not None and 2 * (low.numel() // b) < b - 1
            if self.features is None and not narrow:
                continue
            f = low.to(self.gdtype)  # the kept features are in the Grams' dtype
            if self.features is not None:
                self.features.add(self.slices[m].start + j, f)
            if analytic is not None and narrow:
                # narrow: its features stand in for its Gram in the tail check's draws
                analytic.keep_features(batch, self.slices[m].start + j, f)
        return out

    def _loop(self, window: range | None) -> Iterator[tuple[int, int, Any]]:
        """(global index, size, batch) of the batches in ``window`` (None: all), with the
        progress bar; cancels when ``on_batch`` says so."""
        total = self.src.total if window is None else len(window)
        if self.features is not None:
            self.features.batches = total
        bar = tqdm(total=total, disable=not self.progress, desc="CKA", unit="batch")
        try:
            for i, x in self.src.indexed(window):
                yield i, int(x.shape[0]), x
                if self.features is not None and len(self.features.sizes) == 1:
                    self._check_memory()  # each layer's width is known from the first batch
                bar.update(1)
                done = self.sums.seen
                if self.on_batch is not None and self.on_batch(done, total or 0) is False:
                    raise Cancelled(f"cancelled after {done} batches")
        finally:
            bar.close()

    def _check_memory(self) -> None:
        """Refuse the whole-sample measures (:class:`analysis.OptionsError`) when their estimate
        over the whole plan passes the budget; the plan of an iterable of unknown length is
        not known, and not checked."""
        assert self.features is not None
        if self.options.whole_sample and self.src.total:
            widths = [0 if b is None else int(b.shape[1]) for b in self.features.buffers]
            n = self.src.total * self.options.batch_size
            self.options.check_memory(n, widths, torch.finfo(self.gdtype).bits // 8)

    def _store_parts(self) -> dict[str, Any]:
        """What else the stored Grams depend on (empty: the store is not used), and the note."""
        opts = self.options
        fp = self.src.fingerprint() if self.cache is not None and self.keys else None
        if fp is None:
            self.cache_note = (
                "off"
                if self.cache is None
                else "skipped: no model_keys or no dataset fingerprint (pass dataset_key)"
            )
            return {}
        self.cache_note = "on"
        dtype = None if self.amp is None else str(self.amp).removeprefix("torch.")
        parts = {"dataset": fp, "plan": opts.batch_size, "feature": opts.feature}
        return parts | {"kernel": opts.kernel, "dtype": dtype}

    def minibatch(self, window: range | None = None) -> np.ndarray:
        """Summed per-batch HSIC (L_total, L_total) over the batches in ``window`` (None: all;
        zeros when none was kept); what else the run keeps per batch is in ``self.statistics``.

        The models named in the store's keys have their Grams and blocks read from and written
        to the store.
        """
        self.parts = self._store_parts()
        step = self._batch_stored if self.parts else self._batch
        with torch.inference_mode():
            sum_batches(self._loop(window), self.estimator, step, sums=self.sums)
        if self.sums.hsic is None:
            return np.zeros((self.total_layers, self.total_layers))
        self._keep_stored()
        return self.sums.hsic

    def _keep_stored(self) -> None:
        """Read back from the store the Grams the tail check will draw permutations from and
        the pass did not have at hand (their blocks and invariants were stored): only those
        of models with a layer in a flagged cell, judged on this run's sums."""
        analytic, cache = self.analytic, self.cache
        if analytic is None or analytic.kept is None or not self.unkept or cache is None:
            return
        assert self.sums.hsic is not None
        layers = layers_to_keep(analytic.sums, self.sums.hsic, self.estimator)
        for i, b, m, key in self.unkept:
            if not layers & set(range(self.slices[m].start, self.slices[m].stop)):
                continue
            stored = cache.get(key)
            if stored is not None and stored.shape == (len(self.selected[m]), b, b):
                kf, kr = centred_rows(torch.from_numpy(stored).to(self.dev), self.estimator)
                analytic.keep(kf.view(-1, b, b), i, self.slices[m].start, kr)

    def _batch(self, i: int, x: torch.Tensor) -> np.ndarray:
        """The HSIC matrix of a batch without the store: one product over the stacked Grams."""
        xs = self._per_model(x)
        b = int(x.shape[0])
        stack = torch.empty(self.total_layers, b, b, dtype=self.gdtype, device=self.dev)
        for m in self.names:
            self._grams(m, xs(m), i, out=stack[self.slices[m]])
        if not self.centring:
            out = hsic_from_grams(stack, self.estimator).cpu().numpy()  # the batch's one transfer
            self._update(Batch(i, b, out))
            return out
        rows = centred_rows(stack, self.estimator)
        h = hsic_block(rows, rows, self.estimator)
        out = ((h + h.T) / 2).cpu().numpy()  # as hsic_from_grams
        self._update(Batch(i, b, out, stack, rows))
        return out

    def _batch_stored(self, i: int, x: torch.Tensor) -> np.ndarray:
        """The HSIC matrix of batch ``i``: stored Grams and blocks reused, new ones stored."""
        cache, keys, parts = self.cache, self.keys, self.parts
        b = int(x.shape[0])
        gkeys = {
            m: gram_key(
                model=keys[m],
                batch=i,
                size=b,
                layers=self.selected[m],
                precision=str(self.gdtype),
                **parts,
            )
            for m in self.names
            if m in keys
        }
        # canonical order: a block between two models is computed the same way in every run
        order = sorted(gkeys, key=lambda m: gkeys[m]) + [m for m in self.names if m not in gkeys]
        pairs = [(a, c) for ia, a in enumerate(order) for c in order[ia:]]
        bkeys = {
            (a, c): gram_key(grams=[gkeys[a], gkeys[c]], same=a == c, estimator=self.estimator)
            for a, c in pairs
            if a in gkeys and c in gkeys
        }
        found: dict[tuple[str, str], np.ndarray] = {}
        for (a, c), key in bkeys.items():
            block = cache.get(key) if cache is not None else None
            shape = (len(self.selected[a]), len(self.selected[c]))
            if block is not None and block.shape == shape and block.dtype == np.float64:
                found[a, c] = block
        needed = {m for p in pairs if p not in found for m in p}
        invariants: dict[str, np.ndarray] = {}
        ikeys = {m: gram_key(grams=gkeys[m], null=self.estimator) for m in gkeys}
        if self.analytic is not None:  # the analytic null's per-layer numbers, stored per model
            for m in self.names:
                got = cache.get(ikeys[m]) if cache is not None and m in ikeys else None
                if got is not None and got.shape == (len(self.selected[m]), INVARIANTS):
                    invariants[m] = got
                else:
                    needed.add(m)
        if self.calibrating or self.features is not None:
            needed = set(self.names)  # the permutation null, the spectra, kept features: all
        stacks: dict[str, torch.Tensor] = {}

        rows: dict[str, Rows] = {}
        xs = self._per_model(x)  # inputs made only for the models that run
        for m in order:
            stored = None
            if cache is not None and m in needed and m in gkeys:
                stored = cache.get(gkeys[m])
                if stored is not None and not self._stored_features(m, gkeys[m], b):
                    stored = None  # the kept features are needed too: run the model
            if m in gkeys and m not in needed:
                self.hits += 1  # every block of m is stored: not even its Grams are read
            elif stored is not None and stored.shape == (len(self.selected[m]), b, b):
                self.hits += 1
                stacks[m] = torch.from_numpy(stored).to(self.dev)
                rows[m] = centred_rows(stacks[m], self.estimator)
            else:
                grams = self._grams(m, xs(m), i)
                if cache is not None and m in gkeys:
                    self.misses += 1
                    cache.put(gkeys[m], grams.cpu().numpy())
                    for j, f in enumerate(self._last_features(m, b)):
                        cache.put(gram_key(features=gkeys[m], layer=j), f.cpu().numpy())
                stacks[m] = grams
                rows[m] = centred_rows(grams, self.estimator)
        if self.analytic is not None:
            for m in self.names:
                first = self.slices[m].start
                if m not in invariants:
                    mf, mr = rows[m]
                    invariants[m] = self.analytic.invariants(mf.view(-1, b, b), i, first, mr)
                    if cache is not None and m in ikeys:
                        cache.put(ikeys[m], invariants[m])
                elif m in rows:
                    mf, mr = rows[m]
                    self.analytic.keep(mf.view(-1, b, b), i, first, mr)
                elif self.analytic.kept is not None:
                    self.unkept.append((i, b, m, gkeys[m]))
            stacked_inv = np.concatenate([invariants[m] for m in self.names])
            self.analytic.add_invariants(stacked_inv, b)

        h = torch.zeros(self.total_layers, self.total_layers, dtype=torch.float64, device=self.dev)
        for a, c in pairs:
            if (a, c) not in found:
                self._place(h, a, c, self._block(rows[a], rows[c], a == c))
        out = h.cpu().numpy()  # the batch's one transfer
        self.blocks_reused += len(found)
        for (a, c), key in bkeys.items():
            sa, sc = self.slices[a], self.slices[c]
            if (a, c) in found:
                out[sa, sc], out[sc, sa] = found[a, c], found[a, c].T
            elif cache is not None:
                cache.put(key, np.ascontiguousarray(out[sa, sc]))
        every: torch.Tensor | None = None
        stacked: Rows | None = None
        if self.calibrating:
            ordered = [rows[m] for m in self.names]
            stacked = (torch.cat([r[0] for r in ordered]), torch.cat([r[1] for r in ordered]))
            every = torch.cat([stacks[m] for m in self.names])
        self._update(Batch(i, b, out, every, stacked), stored=True)
        return out

    def _last_features(self, m: str, b: int) -> list[torch.Tensor]:
        """With kept features: those model ``m`` gave on the batch (of ``b``) just run."""
        if self.features is None:
            return []
        layers = range(self.slices[m].start, self.slices[m].stop)
        return [self.features.last(k, b) for k in layers]

    def _stored_features(self, m: str, key: str, b: int) -> bool:
        """With kept features, read model ``m``'s stored features of the batch (Grams key
        ``key``) into them; False when any is missing. Without kept features: True."""
        if self.features is None:
            return True
        assert self.cache is not None
        layers = range(len(self.selected[m]))
        found = [self.cache.get(gram_key(features=key, layer=j)) for j in layers]
        if any(f is None or f.shape[0] != b for f in found):
            return False
        for j, f in enumerate(found):
            assert f is not None
            self.features.add(self.slices[m].start + j, torch.from_numpy(f).to(self.gdtype))
        return True

    def _block(self, ra: Rows, rb: Rows, same: bool) -> torch.Tensor:
        self.blocks_computed += 1
        h = hsic_block(ra, rb, self.estimator)
        return (h + h.T) / 2 if same else h  # a model with itself: symmetric bit for bit

    def _place(self, h: torch.Tensor, a: str, b: str, block: torch.Tensor) -> None:
        sa, sb = self.slices[a], self.slices[b]
        h[sa, sb] = block
        h[sb, sa] = block.T

    def full(self) -> np.ndarray:
        """Exact float64 HSIC over every sample at once (features kept in memory)."""
        parts: list[list[torch.Tensor]] = [[] for _ in range(self.total_layers)]

        def keep(_: int, x: torch.Tensor) -> None:
            inp = self._per_model(x)
            for m in self.names:
                for j, f in enumerate(self._features(m, inp(m))):
                    parts[self.slices[m].start + j].append(f)

        with torch.inference_mode():
            sum_batches(self._loop(None), self.estimator, keep, sums=self.sums)
            if self.sums.n < MIN_SAMPLES[self.estimator]:
                raise EstimatorError(
                    f"{self.sums.n} samples are too few for the {self.estimator} estimator"
                )
            if self.options.whole_sample:
                widths = [int(p[0][0].numel()) if p else 0 for p in parts]
                self.options.check_memory(self.sums.n, widths, torch.finfo(self.gdtype).bits // 8)
            if self.features is None:
                xs = [torch.cat(p).to(torch.float64) for p in parts]
            else:  # the whole-sample measures read them, in the features' own precision
                self.features.keep_whole([torch.cat(p) for p in parts])
                xs = [f.to(torch.float64) for f in self.features.layers()]
            return full_hsic(xs, self.kern, self.estimator).cpu().numpy()

    def counters(self) -> dict[str, Any]:
        """What the run did, as plain values that add up over runs of disjoint batches."""
        return {
            "n": self.sums.n,
            "batches": self.sums.batches,
            "dropped": [dict(d) for d in self.sums.dropped],
            "forwards": dict(self.forwards),
            "hits": self.hits,
            "misses": self.misses,
            "blocks_reused": self.blocks_reused,
            "blocks_computed": self.blocks_computed,
            "cache_note": self.cache_note,
        }


_METHODS = {
    "images": "first-order Hoeffding projection, delta method (analysis.inference.image_intervals)",
    "batches": "percentile bootstrap over batches (analysis.inference.bootstrap)",
}


def diagnostics(
    atlas: Atlas, counters: Mapping[str, Any], config: Mapping[str, Any]
) -> dict[str, Any]:
    """What a run did (its :meth:`StreamingRun.counters`) and what to be careful about in its
    result ``atlas``; ``config`` gives the interval settings."""
    unit, seed = config["interval"], config["seed"]
    owners = [(m, name) for m in atlas.models for name in atlas.layers[m]]
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
    dropped = [dict(d) for d in counters["dropped"]]
    return {
        "n_used": counters["n"],
        "batches": counters["batches"],
        "dropped_batches": dropped,
        "dropped_samples": sum(d["size"] for d in dropped),
        "forward_passes": dict(counters["forwards"]),
        "gram_cache": {
            "mode": counters["cache_note"],
            "hits": counters["hits"],
            "misses": counters["misses"],
            "blocks_reused": counters["blocks_reused"],
            "blocks_computed": counters["blocks_computed"],
        },
        "undefined_layers": undefined,
        "negative_cells": negative,
        "bootstrap": {"replicates": config["resamples"], "seed": seed, "level": 0.95}
        if unit == "batches"
        else None,
        "interval": None
        if unit == "none"
        else {"unit": unit, "method": _METHODS[unit], "level": 0.95},
    }


def full_hsic(xs: list[torch.Tensor], kern: Kernel, estimator: str) -> torch.Tensor:
    """Exact HSIC of every pair of feature matrices ``xs`` (n, d_i) over all n samples."""
    n = xs[0].shape[0]
    if kern.name == "linear" and all(x.shape[1] < n for x in xs):
        return hsic_linear_features(xs, estimator)
    return hsic_from_grams(torch.stack([gram(x, kern) for x in xs]), estimator)
