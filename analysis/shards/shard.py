"""One comparison split into ranges of batches: run each range anywhere, then combine the sums.

Everything a minibatch comparison accumulates is its HSIC sums and the states of its
statistics (:mod:`analysis.batch_statistics`), and every state joins over ranges of batches:
sums add (the permutation null's too: batch i draws from its own random stream, seeded with
its global index, see :mod:`analysis.inference.permutation_null`), the bootstrap's per-batch
terms and the sensitivity's features join end to end in batch order, and the analytic null's
kept Grams by their global batch index (:mod:`analysis.inference.analytic_null`). So a
:class:`Partial` holds those sums and states for the batches [start, stop) of the plan,
:func:`run_partial` computes one (reading only its own batches; the Gram store is keyed
by the global batch index, so stored Grams are shared with unsplit runs), and
:func:`combine` adds up partials that tile the plan and finishes exactly as
:func:`analysis.compare` does, which is ``combine`` of one partial over the whole plan. Sums
taken in another grouping differ from the unsplit ones in the last bits.

A partial is one safetensors file (:meth:`Partial.save`, :mod:`analysis.shards.file`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import nn

from analysis.atlas import Atlas
from analysis.batch_statistics import registry
from analysis.batch_statistics.protocol import BatchStatistic, Finishing, Tick, sum_states
from analysis.data.gpu_jpeg import jpeg_decoder
from analysis.data.preprocessing import input_record, model_input
from analysis.data.sources import DataLike, batch_source, image_files, load_data
from analysis.engine.streaming import RunSettings, StreamingRun, diagnostics
from analysis.errors import AnalysisError, EstimatorError
from analysis.estimators.batches import NO_BATCH
from analysis.options import CompareOptions, OptionsError
from analysis.shards.file import Partial

__all__ = [
    "Partial",
    "batch_count",
    "batch_total",
    "combine",
    "run_partial",
    "shard_ranges",
]


def batch_count(data: DataLike, batch_size: int) -> int:
    """Batches in the plan of ``data`` (an array or tensor, ImageDataset, image folder, dataset
    spec, or a DataLoader with a length); nothing is decoded or run."""
    total = batch_total(data, batch_size)
    if total is None:
        raise AnalysisError("an iterable of unknown length has no batch count")
    return total


def batch_total(data: DataLike, batch_size: int) -> int | None:
    """:func:`batch_count`, or None for an iterable of unknown length."""
    if batch_size < 1:
        raise AnalysisError(f"batch_size must be at least 1, not {batch_size}")
    data = load_data(data)
    return batch_source(data, batch_size, None, files=image_files(data) is not None).total


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
    """The one entry point of a run: ``opts`` over the batches in ``batches`` of the plan
    (None: the whole plan, also of an iterable of unknown length), run as ``settings`` say.
    A comparison's run step is :func:`combine` of the whole plan's partial, or of its shards'
    (:mod:`analysis.comparison.run`)."""
    names = list(models)
    if not names:
        raise AnalysisError("no models to compare")
    dev = settings.torch_device
    data = load_data(data)
    files = image_files(data) is not None  # image files: every model through its pipeline
    key, decoded = settings.dataset_key, settings.decoded_cache
    jpeg = jpeg_decoder(dev)[0] if files and decoded and settings.gpu_jpeg else None
    src = batch_source(data, opts.batch_size, key, files=files, decoded_cache=decoded, jpeg=jpeg)
    inputs = {m: model_input(models[m], src) for m in names}
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
        "input": input_record(src, inputs),
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
    return Partial(
        names=names,
        selected={m: list(v) for m, v in run.selected.items()},
        config=config,
        start=span.start,
        stop=span.stop,
        total_batches=run.sums.seen if window is None else int(src.total or 0),
        hsic=np.asarray(h, dtype=np.float64),
        counters=run.counters(),
        statistics={key: s.state() for key, s in run.statistics.items()},
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


def combine(partials: Sequence[Partial], *, tick: Tick | None = None) -> Atlas:
    """The :class:`Atlas` that :func:`analysis.compare` gives for the whole plan, from partials
    (in any order) that tile it exactly once with equal models, layers and config; anything
    else is an :class:`AnalysisError` that names the problem. Only the device may differ
    (shards run on several GPUs): ``config["device"]`` lists each one once, in batch order.
    ``tick(done, total)``: the progress of a long finish (the whole-sample measures, by pairs
    of layers), which may raise :class:`analysis.Cancelled` to stop it."""
    parts = sorted(partials, key=lambda p: (p.start, p.stop))
    if not parts:
        raise AnalysisError("no partials to combine")
    _check(parts)
    first = parts[0]
    config, counters = dict(first.config), _merge_counters(parts)
    config["device"] = ", ".join(dict.fromkeys(str(p.config["device"]) for p in parts))
    if config["mode"] != "full" and not counters["batches"]:
        raise EstimatorError(NO_BATCH)
    hsic = sum_states([{"hsic": p.hsic} for p in parts], "HSIC")["hsic"]
    selected = {m: list(first.selected[m]) for m in first.names}
    done = Finishing(hsic, counters["n"], config, [len(selected[m]) for m in first.names])
    diagnose = []
    for cls in _statistics(parts):  # in the registry's order
        state = cls.join([p.statistics[cls.key] for p in parts])
        more = cls.finish(state, done, counters["batches"], tick or _no_tick)
        if more is not None:
            diagnose.append(more)
    atlas = Atlas(list(first.names), selected, hsic, counters["n"], config, {}, done.values)
    atlas.diagnostics = diagnostics(atlas, counters, config)
    for more in diagnose:
        atlas.diagnostics |= more(atlas)
    return atlas


def _no_tick(done: int, total: int) -> None:
    """A finish's progress that nobody reads."""


def _statistics(parts: list[Partial]) -> list[type[BatchStatistic]]:
    """The registered statistics the partials accumulated, which must be the same in each."""
    first = parts[0]
    for p in parts[1:]:
        if set(p.statistics) != set(first.statistics):
            odd = sorted(set(p.statistics) ^ set(first.statistics))[0]
            raise AnalysisError(f"some partials have the {odd} statistic and some do not")
    for key in first.statistics:
        registry.statistic(key)  # a key this version does not know is an error that names it
    return [cls for cls in registry.STATISTICS if cls.key in first.statistics]
