"""One comparison split into ranges of batches: run each range anywhere, then combine the sums.

Everything a minibatch comparison accumulates is a sum over the batches of its plan: the HSIC
terms, the permutation null (batch i draws from its own random stream, seeded with the global
index i, see :mod:`analysis.calibration`), the analytic null's cumulants, the layer spectra and
the deflated terms; only the bootstrap needs the per-batch terms themselves, in batch order,
and the analytic null's tail check the per-batch Grams it kept (each tagged with its global
batch index, so they join in any order; :mod:`analysis.analytic_null`). So a
:class:`Partial` holds those sums for the batches [start, stop) of the plan,
:func:`compare_partial` computes one (reading only its own batches; the Gram store is keyed
by the global batch index, so stored Grams are shared with unsplit runs), and
:func:`combine` adds up partials that tile the plan and finishes exactly as
:func:`analysis.compare` does, which is ``combine`` of one partial over the whole plan. Sums
taken in another grouping differ from the unsplit ones in the last bits.

A partial is one safetensors file (:meth:`Partial.save`, :mod:`analysis.partial_file`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.analytic_null import finish, join_states, tail_warning
from analysis.atlas import Atlas
from analysis.batches import NO_BATCH
from analysis.bootstrap import bootstrap_intervals
from analysis.calibration import summarise_null
from analysis.errors import AnalysisError, EstimatorError
from analysis.flags import calibration_flags
from analysis.gram_cache import GramCache
from analysis.hsic import cka_from_hsic
from analysis.intervals import MOMENTS, image_intervals
from analysis.measures import DEFAULT_K, MeasureMatrices, measure_matrices
from analysis.measures.report import degenerate_warning, measures_diagnostics
from analysis.options import CompareOptions, OptionsError
from analysis.partial_file import SPECTRA, Partial
from analysis.preprocessing import model_input
from analysis.sources import DataLike, batch_source, image_files, load_data
from analysis.spectrum import whole_sample_sensitivity
from analysis.streaming import RunSettings, StreamingRun, diagnostics

__all__ = [
    "Partial",
    "batch_count",
    "combine",
    "compare_partial",
    "run_partial",
    "shard_ranges",
]


def batch_count(data: DataLike, batch_size: int) -> int:
    """Batches in the plan of ``data`` (an array or tensor, ImageDataset, image folder, dataset
    spec, or a DataLoader with a length); nothing is decoded or run."""
    if batch_size < 1:
        raise AnalysisError(f"batch_size must be at least 1, not {batch_size}")
    data = load_data(data)
    total = batch_source(data, batch_size, None, files=image_files(data) is not None).total
    if total is None:
        raise AnalysisError("an iterable of unknown length has no batch count")
    return total


def shard_ranges(total_batches: int, shards: int) -> list[range]:
    """Contiguous, non-empty ranges tiling ``range(total_batches)``, lengths differing by at
    most one (longer first); ``min(shards, total_batches)`` of them."""
    if total_batches < 0 or shards < 1:
        raise AnalysisError(f"cannot split {total_batches} batches into {shards} shards")
    count = min(shards, total_batches)
    ranges, start = [], 0
    for k in range(count):
        stop = start + total_batches // count + (k < total_batches % count)
        ranges.append(range(start, stop))
        start = stop
    return ranges


def compare_partial(
    models: Mapping[str, nn.Module],
    data: DataLike,
    options: CompareOptions | None = None,
    *,
    batches: range,
    device: str | torch.device | None = None,
    progress: bool = False,
    gram_cache: GramCache | None = None,
    model_keys: Mapping[str, str] | None = None,
    on_batch: Callable[[int, int], bool | None] | None = None,
    dataset_key: str | None = None,
    **shortcuts: Any,
) -> Partial:
    """:func:`analysis.compare` over the batches with indices in ``batches`` only.

    Arguments as for ``compare``; ``on_batch(done, total)`` counts within the range. The range
    must lie within the plan (:func:`batch_count`); ``mode="full"`` is exact over all samples
    at once, so it is refused (:class:`analysis.OptionsError`) unless the range is the whole plan.
    """
    settings = RunSettings(device, progress, gram_cache, model_keys, on_batch, dataset_key)
    return run_partial(models, data, CompareOptions.build(options, **shortcuts), batches, settings)


def _window(batches: range, total: int | None, mode: str) -> range:
    if not isinstance(batches, range) or batches.step != 1:
        raise AnalysisError("batches must be a range of consecutive batch indices")
    if total is None:
        raise AnalysisError("an iterable of unknown length cannot be split into batch ranges")
    if mode == "full" and (batches.start, batches.stop) != (0, total):
        raise OptionsError(
            "mode",
            "full_needs_whole_plan",
            f"mode: full is exact over every sample at once and cannot run on batches "
            f"{batches.start}..{batches.stop - 1} alone; use minibatch, or all {total} batches",
        )
    if not 0 <= batches.start < batches.stop <= total:
        raise AnalysisError(
            f"batches [{batches.start}, {batches.stop}) are not a non-empty range "
            f"within the plan's {total} batches"
        )
    return batches


def run_partial(
    models: Mapping[str, nn.Module],
    data: DataLike,
    opts: CompareOptions,
    batches: range | None,
    settings: RunSettings,
) -> Partial:
    """The one entry point of a comparison: ``opts`` over the batches in ``batches`` of the plan
    (None: the whole plan, also of an iterable of unknown length), run as ``settings`` say.
    :func:`analysis.compare` is :func:`combine` of the whole plan's partial."""
    names = list(models)
    if not names:
        raise AnalysisError("no models to compare")
    dev = settings.torch_device
    data = load_data(data)
    files = image_files(data) is not None  # image files: every model through its pipeline
    inputs = {m: model_input(models[m], files) for m in names}
    src = batch_source(data, opts.batch_size, settings.dataset_key, files=files)
    model_keys = settings.model_keys
    if model_keys:  # a model's Grams depend on its pipeline as much as on its weights
        model_keys = {m: f"{k}|input:{inputs[m].key}" for m, k in model_keys.items() if m in inputs}
    run = StreamingRun(
        models,
        opts,
        src,
        device=dev,
        inputs={m: inputs[m] for m in names if inputs[m].pipeline is not None},
        progress=settings.progress,
        on_batch=settings.on_batch,
        gram_cache=settings.gram_cache,
        model_keys=model_keys,
    )
    window = None if batches is None else _window(batches, src.total, opts.mode)
    if src.total is not None:
        opts.check_batches(src.total)
    amp, layers = opts.autocast, opts.layers
    # Every option as recorded with the atlas (the deprecated bootstrap is never kept), with the
    # layers as resolved for a per-model selection, the dtype by its torch name, and the device.
    config: dict[str, Any] = opts.model_dump(mode="json", exclude={"bootstrap"})
    config |= {
        "layers": run.selected if isinstance(layers, Mapping) else _jsonable(layers),
        "device": str(dev),
        "dtype": None if amp is None else str(amp).removeprefix("torch."),
    }
    training = {m: models[m].training for m in names}
    try:
        for m in names:
            models[m].to(dev).eval()
        h = run.full() if opts.mode == "full" else run.minibatch(window)
    finally:
        for m in names:
            models[m].train(training[m])
    if window is None:
        run.sums.require()
    config["dataset"] = src.key  # hashed only when the cache needed it
    span = window if window is not None else range(0, run.sums.seen)
    kept = None  # the per-batch terms, for the bootstrap
    if opts.mode != "full" and opts.interval == "batches":
        width, per_batch = run.total_layers, run.sums.per_batch
        kept = np.stack(per_batch) if per_batch else np.zeros((0, width, width))
    feats = run.kept_features()
    return Partial(
        names=names,
        selected={m: list(v) for m, v in run.selected.items()},
        config=config,
        start=span.start,
        stop=span.stop,
        total_batches=run.sums.seen if window is None else int(src.total or 0),
        hsic=np.asarray(h, dtype=np.float64),
        per_batch=kept,
        null=None if run.null is None else run.null.sums.cpu().numpy(),
        spectra=None if run.spectra is None else run.spectra.state(),
        counters=run.counters(),
        null_moments=None if run.analytic is None else run.analytic.state(),
        moments=None if run.moments is None else run.moments.state(),
        features=feats,
        sizes=None if feats is None else np.array(run.feature_sizes(), dtype=np.int64),
    )


def _jsonable(layers: str | int | Sequence[str | int] | None) -> str | int | list[str | int] | None:
    if layers is None or isinstance(layers, str | int):
        return layers
    return list(layers)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _what(config: dict[str, Any]) -> dict[str, Any]:
    """What a comparison computes: its config less where it ran (shards on several GPUs)."""
    return {k: v for k, v in config.items() if k != "device"}


def _check(parts: list[Partial]) -> None:
    """Equal names, layers and config, and ranges that tile the plan exactly once."""
    first = parts[0]
    where = f"[{first.start}, {first.stop})"
    for p in parts[1:]:
        here = f"partial [{p.start}, {p.stop})"
        if p.names != first.names or _canonical(p.selected) != _canonical(first.selected):
            raise AnalysisError(f"{here} compares other models or layers than partial {where}")
        if _canonical(_what(p.config)) != _canonical(_what(first.config)):
            keys = sorted(set(p.config) | set(first.config) - {"device"})
            mine, theirs = p.config.get, first.config.get
            diff = next(k for k in keys if _canonical(mine(k)) != _canonical(theirs(k)))
            raise AnalysisError(
                f"{here} has config {diff}={p.config.get(diff)!r}, partial {where} "
                f"{first.config.get(diff)!r}: they are not parts of one comparison"
            )
        if p.total_batches != first.total_batches:
            raise AnalysisError(
                f"{here} is from a plan of {p.total_batches} batches, partial {where} "
                f"from one of {first.total_batches}"
            )
    total, covered = first.total_batches, 0
    for p in parts:
        if not 0 <= p.start < p.stop <= total:
            raise AnalysisError(f"partial [{p.start}, {p.stop}) is not within {total} batches")
        if p.start > covered:
            raise AnalysisError(f"gap: batches [{covered}, {p.start}) are in no partial")
        if p.start < covered:
            raise AnalysisError(
                f"overlap: batches [{p.start}, {min(covered, p.stop)}) are in more than one partial"
            )
        covered = p.stop
    if covered < total:
        raise AnalysisError(f"gap: batches [{covered}, {total}) are in no partial")


def _sum(arrays: Sequence[np.ndarray | None], what: str) -> np.ndarray | None:
    if all(a is None for a in arrays):
        return None
    if any(a is None for a in arrays):
        raise AnalysisError(f"some partials have {what} and some do not")
    out = np.array(arrays[0], dtype=np.float64, copy=True)
    for a in arrays[1:]:
        out += np.asarray(a)
    return out


def _merge_counters(parts: list[Partial]) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(int(p.counters[key]) for p in parts)

    notes = list(dict.fromkeys(str(p.counters["cache_note"]) for p in parts))
    names = parts[0].names
    return {
        "n": total("n"),
        "batches": total("batches"),
        "dropped": [dict(d) for p in parts for d in p.counters["dropped"]],
        "forwards": {m: sum(int(p.counters["forwards"][m]) for p in parts) for m in names},
        "hits": total("hits"),
        "misses": total("misses"),
        "blocks_reused": total("blocks_reused"),
        "blocks_computed": total("blocks_computed"),
        "cache_note": notes[0] if len(notes) == 1 else "; ".join(notes),
    }


def combine(partials: Sequence[Partial]) -> Atlas:
    """The :class:`Atlas` that :func:`analysis.compare` gives for the whole plan, from partials
    (in any order) that tile it exactly once with equal models, layers and config; anything
    else is an :class:`AnalysisError` that names the problem. Only the device may differ
    (shards run on several GPUs): ``config["device"]`` lists each one once, in batch order."""
    parts = sorted(partials, key=lambda p: (p.start, p.stop))
    if not parts:
        raise AnalysisError("no partials to combine")
    _check(parts)
    first = parts[0]
    config, counters = dict(first.config), _merge_counters(parts)
    config["device"] = ", ".join(dict.fromkeys(str(p.config["device"]) for p in parts))
    if config["mode"] != "full" and not counters["batches"]:
        raise EstimatorError(NO_BATCH)
    hsic = _sum([p.hsic for p in parts], "HSIC")
    assert hsic is not None
    null = _sum([p.null for p in parts], "a permutation null")
    analytic = [p.null_moments for p in parts]
    if any(a is None for a in analytic) and not all(a is None for a in analytic):
        raise AnalysisError("some partials have an analytic null and some do not")
    spectra = None
    if any(p.spectra is not None for p in parts):
        sums = {k: _sum([(p.spectra or {}).get(k) for p in parts], "spectra") for k in SPECTRA}
        spectra = {k: v for k, v in sums.items() if v is not None}
    ci_low = ci_high = None
    if config["interval"] == "batches" and all(p.per_batch is not None for p in parts):
        CompareOptions.build(interval="batches").check_batches(counters["batches"])
        per_batch = np.concatenate([np.asarray(p.per_batch) for p in parts])
        if len(per_batch):
            ci_low, ci_high = bootstrap_intervals(per_batch, config["resamples"], config["seed"])
    moments = None
    if any(p.moments is not None for p in parts):
        moments = {k: _sum([(p.moments or {}).get(k) for p in parts], "moments") for k in MOMENTS}
    if moments is not None and config["mode"] != "full":
        ci_low, ci_high = image_intervals(hsic, {k: v for k, v in moments.items() if v is not None})
    selected = {m: list(first.selected[m]) for m in first.names}
    atlas = Atlas(list(first.names), selected, hsic, counters["n"], config, {}, ci_low, ci_high)
    if spectra is not None and config["sensitivity"]:
        spectra |= _deflated(parts, config, hsic)
    _finish_calibration(atlas, null, spectra, bool(config["sensitivity"]))
    wanted = [m for m in config.get("measures") or () if m != "cka"]
    found = _measures(parts, wanted, int(config.get("knn_k") or DEFAULT_K)) if wanted else None
    if found is not None:
        atlas.measures, atlas.cca_flags = found.values, found.degenerate
    tail = None
    if all(a is not None for a in analytic):
        state = join_states([a for a in analytic if a is not None])
        estimator, seed, batches = config["estimator"], config["seed"], counters["batches"]
        atlas.null, tail = finish(state, atlas.hsic, estimator, seed, batches)
    atlas.diagnostics = diagnostics(atlas, counters, config)
    if spectra is not None:
        warnings, flags = calibration_flags(atlas, counters["n"] / max(counters["batches"], 1))
        atlas.diagnostics |= {"warnings": warnings, "flags": flags}
    if found is not None:
        owners = [(m, layer) for m in atlas.models for layer in atlas.layers[m]]
        atlas.diagnostics["measures"] = measures_diagnostics(owners, found)
        atlas.diagnostics["warnings"] = [*atlas.warnings, *degenerate_warning(found)]
    if tail is not None:
        atlas.diagnostics["null"] = tail
        if tail["without_draws"]:
            atlas.diagnostics["warnings"] = [*atlas.warnings, tail_warning(tail)]
    return atlas


def _deflated(
    parts: list[Partial], config: dict[str, Any], hsic: np.ndarray
) -> dict[str, np.ndarray]:
    """The deflated HSIC sums of the whole sample (every partial's features, in batch order;
    ``hsic``: the intact sums) and each layer's whole-sample top-component share."""
    if any(p.features is None or p.sizes is None for p in parts):
        raise AnalysisError("some partials have no features for the sensitivity")
    parts = [p for p in parts if len(np.asarray(p.sizes))]  # a range may have kept no batch
    width = len(parts[0].features or []) if parts else 0
    features = [_joined([(p.features or [])[k] for p in parts]) for k in range(width)]
    sizes = [int(n) for p in parts for n in np.asarray(p.sizes)]
    kern = CompareOptions.build(kernel=config["kernel"]).parsed_kernel
    cross, own, share = whole_sample_sensitivity(features, sizes, kern, config["estimator"], hsic)
    return {"deflated_cross": cross, "deflated_self": own, "top_share": share}


def _measures(parts: list[Partial], wanted: list[str], k: int) -> MeasureMatrices:
    """The whole-sample measures ``wanted`` from every partial's kept features, in batch order."""
    if any(p.features is None for p in parts):
        raise AnalysisError("some partials have no features for the measures")
    parts = [p for p in parts if p.sizes is None or len(np.asarray(p.sizes))]
    width = len(parts[0].features or []) if parts else 0
    features = [_joined([(p.features or [])[j] for p in parts]) for j in range(width)]
    return measure_matrices(features, wanted, k=k)


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts one after the other, on the host; one alone as it is, on its device (a layer's
    kept features can run to gigabytes, and ``compare`` is one partial, whose features a CUDA
    run keeps on the GPU)."""
    return parts[0] if len(parts) == 1 else torch.cat([p.cpu() for p in parts])


def _finish_calibration(
    atlas: Atlas, null: np.ndarray | None, spectra: dict[str, np.ndarray] | None, sensitivity: bool
) -> None:
    """The null summary, the layer spectra's means and the deflated CKA into ``atlas``."""
    if null is not None:
        sizes = [len(atlas.layers[m]) for m in atlas.models]
        atlas.null, _ = summarise_null(null, atlas.hsic, sizes)
    if spectra is None:
        return
    count = max(int(spectra["batches"]), 1)
    atlas.layer_effective_dim = spectra["pr"] / count
    # with the sensitivity, the whole sample's top share (the batches recorded none)
    atlas.layer_top_share = spectra["top_share"] if sensitivity else spectra["share"] / count
    if sensitivity:
        drop = cka_from_hsic(
            spectra["deflated_cross"], spectra["deflated_self"], np.diag(atlas.hsic)
        )
        drop[~np.isfinite(atlas.cka)] = np.nan
        atlas.cka_drop = drop
