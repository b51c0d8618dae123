"""A comparison run as planned: run → combine → baselines → decide, with the caller's hooks.

:func:`run_comparison` executes a :class:`~analysis.comparison.plan.ComparisonPlan`. What it
cannot know comes from the caller as :class:`Hooks`: where networks come from (the members, the
seed ceiling's siblings: :class:`Networks`), the Gram store, progress and cancel
(``on_batch``), whether the run step was spread over workers (``shards``) and where the result
goes (``write``). :func:`analysis.compare` is that with the networks a notebook holds; the
service's comparison job is that with its checkpoint store (``app.jobs.compare``).

1. **run**: every member over the batch plan, one forward pass each per batch
   (:func:`analysis.shards.shard.run_partial`), or the shards' partials, run elsewhere;
2. **combine**: the partials' sums finished into the atlas, intervals, p-values and the
   whole-sample measures included (:func:`analysis.shards.shard.combine`);
3. **baselines**: the untrained twins and the seed ceiling, each an atlas of stand-ins run by
   this same pipeline (:mod:`analysis.comparison.baselines`, which receive the run function);
4. **decide**: the atlas derives each cell's q-value and verdicts from what it now holds
   (:meth:`analysis.Atlas.verdicts`); nothing more is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from analysis.atlas import Atlas
from analysis.batch_statistics.cell_image_terms import KEY as CELL_PROJECTIONS
from analysis.comparison.baselines import random_init_baseline
from analysis.comparison.plan import (
    ComparisonPlan,
    Networks,
    OnBatch,
    Progress,
    members_of,
    plan_comparison,
)
from analysis.comparison.seed_ceiling import (
    AMONG_THE_MODELS,
    Identity,
    seed_ceiling_baseline,
    undefined_blocks,
)
from analysis.data.decoded import DecodedCache
from analysis.data.sources import DataLike, load_data
from analysis.engine.gram_cache import GramCache
from analysis.engine.streaming import RunSettings
from analysis.options import CompareOptions
from analysis.shards.shard import Partial, batch_total, combine, run_partial

__all__ = [
    "GivenNetworks",
    "Hooks",
    "add_baselines",
    "compare",
    "compare_partial",
    "run_comparison",
    "run_shard",
]


class GivenNetworks:
    """The networks a caller holds (:class:`Networks`): ``models`` by name, and ``siblings``
    that are only candidates for the seed ceiling, never compared; each leased under its key in
    ``keys`` (a checkpoint's sha256, say), else its name."""

    where = AMONG_THE_MODELS

    def __init__(
        self,
        models: Mapping[str, nn.Module],
        siblings: Mapping[str, nn.Module] | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> None:
        self.nets: dict[str, nn.Module] = {}
        self.identities: list[Identity] = []
        for name, net in [*models.items(), *(siblings or {}).items()]:
            key = (keys or {}).get(name, name)
            self.nets.setdefault(key, net)
            ident = Identity.of_model(name, net, key)
            if ident is not None:
                self.identities.append(ident)

    def candidates(self, archs: Collection[str]) -> Sequence[Identity]:
        return [i for i in self.identities if i.arch in archs]

    @contextmanager
    def lease(self, keys: Sequence[str]) -> Iterator[Mapping[str, nn.Module]]:
        yield {k: self.nets[k] for k in keys}


@dataclass(frozen=True)
class Hooks:
    """What the caller of :func:`run_comparison` supplies (see the module docstring).

    ``device``: where every network runs (default CUDA if available); ``progress``: tqdm bars;
    ``gram_cache``: stored Grams, for members with a ``cache_key``; ``dataset_key``: names a
    DataLoader's data for the store; ``on_batch(done, total)``: progress over every phase,
    False stops (:class:`analysis.Cancelled`); ``shards(plan)``: the partials of the plan's
    shards (``plan.shards``), run elsewhere (:func:`run_shard`), or None to run the plan here in
    one piece; ``write(atlas)``: where the result goes, the last step; ``decoded_cache``: where
    image files' pixels are kept, decoded once per pipeline (:mod:`analysis.data.decoded`), their
    JPEG files decoded on the CUDA ``device`` with ``gpu_jpeg`` (:mod:`analysis.data.gpu_jpeg`).
    """

    networks: Networks
    device: str | torch.device | None = None
    progress: bool = False
    gram_cache: GramCache | None = None
    dataset_key: str | None = None
    on_batch: OnBatch | None = None
    shards: Callable[[ComparisonPlan], Sequence[Partial] | None] | None = None
    write: Callable[[Atlas], None] | None = None
    decoded_cache: DecodedCache | None = None
    gpu_jpeg: bool = False

    def settings(
        self, cache_keys: Mapping[str, str] | None, on_batch: OnBatch | None
    ) -> RunSettings:
        """The engine's settings for one run of networks with these Gram-store keys."""
        return RunSettings(
            self.device,
            self.progress,
            self.gram_cache,
            cache_keys,
            on_batch,
            self.dataset_key,
            self.decoded_cache,
            self.gpu_jpeg,
        )


def run_comparison(plan: ComparisonPlan, data: DataLike, hooks: Hooks) -> Atlas:
    """The atlas of ``plan`` over ``data`` (see the module docstring)."""
    data = load_data(data)
    progress = plan.progress(hooks.on_batch)
    partials = hooks.shards(plan) if hooks.shards is not None else None
    # the members are leased unless shards ran them and no baseline needs them
    members = [m.key for m in plan.members] if partials is None or plan.options.baselines else []
    with hooks.networks.lease(list(dict.fromkeys(members + plan.sibling_keys))) as pool:
        nets = {m.label: pool[m.key] for m in plan.members if m.key in pool}
        if partials is None:
            partials = [_run(plan, data, hooks, nets, None, progress.phase("run"))]
        atlas = combine(partials, tick=progress.ticker("measures"))
        if plan.options.baselines:
            _baselines(plan, atlas, nets, pool, data, hooks, progress)
    if hooks.write is not None:
        hooks.write(atlas)
    progress.done()
    return atlas


def run_shard(plan: ComparisonPlan, data: DataLike, hooks: Hooks, batches: range) -> Partial:
    """The run step of ``plan`` over the batches ``batches`` only (one of its shards), wherever
    it runs; ``hooks.on_batch`` counts within the range."""
    with hooks.networks.lease([m.key for m in plan.members]) as pool:
        nets = {m.label: pool[m.key] for m in plan.members}
        return _run(plan, load_data(data), hooks, nets, batches, hooks.on_batch)


def _run(
    plan: ComparisonPlan,
    data: Any,
    hooks: Hooks,
    nets: Mapping[str, nn.Module],
    batches: range | None,
    on_batch: OnBatch | None,
) -> Partial:
    """The members over ``batches`` of the plan (None: all), each through its Gram-store key."""
    keys = {m.label: m.cache_key for m in plan.members if m.cache_key}
    settings = hooks.settings(keys or None, on_batch)
    return run_partial(nets, data, plan.options, batches, settings)


def _baselines(
    plan: ComparisonPlan,
    atlas: Atlas,
    nets: Mapping[str, nn.Module],
    pool: Mapping[str, nn.Module],
    data: Any,
    hooks: Hooks,
    progress: Progress,
) -> None:
    """The baselines ``plan`` asks for into ``atlas``: ``atlas.baselines``, the diagnostics'
    ``undefined_baselines`` and ``siblings``, and one warning per baseline and reason a block is
    undefined."""
    opts = plan.options

    def run(
        stand_ins: Mapping[str, nn.Module],
        options: CompareOptions,
        cache_keys: Mapping[str, str] | None,
        on_batch: OnBatch | None,
    ) -> Atlas:
        """The run function of a baseline: an atlas of its stand-ins, by this pipeline."""
        settings = hooks.settings(cache_keys, on_batch)
        return combine([run_partial(stand_ins, data, options, None, settings)])

    # the cells' per-image projections, kept for the paired verdicts and never stored
    projections = atlas.values.pop(CELL_PROJECTIONS, None)
    stored: dict[str, Any] = {}
    if "random_init" in opts.baselines:
        draws = opts.random_init_draws
        stored["random_init"] = random_init_baseline(
            nets,
            opts,
            layers=plan.layers,
            model_keys={m.label: m.key for m in plan.members},
            run=run,
            on_draw=lambda d: progress.part("random_init", d, draws),
            projections=projections,
        )
    if plan.ceiling is not None:
        stored["seed_ceiling"] = seed_ceiling_baseline(
            nets,
            plan.layers,
            plan.ceiling.chosen,
            pool,
            opts,
            run=run,
            on_batch=progress.phase("seed_ceiling"),
            projections=projections,
        )
        atlas.diagnostics["siblings"] = {
            label: [s.describe() for s in sibs] for label, sibs in plan.ceiling.siblings.items()
        }
    atlas.baselines = stored
    if undefined := undefined_blocks(stored):
        atlas.diagnostics["undefined_baselines"] = undefined
        atlas.diagnostics["warnings"] = [
            *atlas.diagnostics.get("warnings", []),
            *_undefined_warnings(undefined),
        ]


def _undefined_warnings(undefined: list[dict[str, Any]]) -> list[str]:
    """One warning per baseline and reason, naming its blocks."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for item in undefined:
        where = item["a"] if item["a"] == item["b"] else f"{item['a']} × {item['b']}"
        grouped.setdefault((item["baseline"], item["reason"]), []).append(where)
    return [
        f"{name.replace('_', ' ')} undefined for {', '.join(blocks)}: {reason}"
        for (name, reason), blocks in grouped.items()
    ]


def _library_plan(
    models: Mapping[str, nn.Module],
    data: Any,
    options: CompareOptions,
    model_keys: Mapping[str, str] | None,
    siblings: Mapping[str, nn.Module] | None,
) -> tuple[ComparisonPlan, GivenNetworks]:
    """The plan of comparing networks a caller holds, and those networks by key."""
    members = members_of(models, options, model_keys)
    networks = GivenNetworks(models, siblings, model_keys)
    plan = plan_comparison(
        members, options, batches=batch_total(data, options.batch_size), networks=networks
    )
    return plan, networks


def compare(
    models: Mapping[str, nn.Module],
    data: DataLike,
    options: CompareOptions | None = None,
    *,
    device: str | torch.device | None = None,
    progress: bool = False,
    gram_cache: GramCache | None = None,
    model_keys: Mapping[str, str] | None = None,
    on_batch: OnBatch | None = None,
    dataset_key: str | None = None,
    siblings: Mapping[str, nn.Module] | None = None,
    decoded_cache: DecodedCache | None = None,
    gpu_jpeg: bool = False,
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
    per model; an array of the model's input shape is read as it is (normalised), one of
    another shape goes through the pipeline as images do, mapped from its value range
    (uint8, declared or inferred: :mod:`analysis.data.ranges`); ``atlas.config["input"]``
    records which model read what. ``dtype``
    (``"bf16"``/``"fp16"``) autocasts the forward pass; Grams stay fp32. ``interval="images"``
    adds image-level 95 % intervals, ``interval="batches"`` percentile intervals from
    ``resamples`` minibatch resamples (seeded with ``seed``).

    ``baselines=("random_init", "seed_ceiling")`` adds untrained twins of every model and, for
    a model with a seed sibling among ``models`` or ``siblings`` (networks that are only
    candidates, never compared), the sibling in its place; each cell then has its verdicts
    (:meth:`Atlas.verdicts`), and ``interval`` ``"none"`` becomes ``"images"``. A sibling is the
    same architecture and options with another seed, trained on the same data as recorded by
    :func:`models.load` (see :mod:`analysis.comparison.seed_ceiling`); ``model_keys`` may name
    siblings too.

    The rest is plumbing. ``gram_cache`` with ``model_keys`` (a stable identity per model,
    e.g. its checkpoint sha256) reuses stored Grams instead of running a model;
    ``dataset_key`` names a DataLoader's data for that purpose (tensors and datasets are
    hashed). ``decoded_cache`` (e.g. :class:`analysis.DirectoryDecodedCache`) keeps image
    files' pixels, decoded once per pipeline, for the next comparison of the same files
    (:mod:`analysis.data.decoded`); ``gpu_jpeg=True`` fills it with JPEG files decoded on the
    CUDA ``device`` where it can (:mod:`analysis.data.gpu_jpeg`, under keys of their own).
    ``on_batch(done, total)`` is called after every batch of
    every phase and step of the finish, counting batches weighted by the networks each phase
    runs (``total`` is 0 when unknown; :mod:`analysis.comparison.plan`); returning False stops with
    :class:`analysis.Cancelled`. Models are moved to ``device`` (default: CUDA if available)
    and run in eval mode; their mode is restored.

    Calibration (minibatch mode): ``permutations=P`` adds a permutation null per cell from
    the same Grams (p-values, null mean and 95 % quantile, seeded with ``seed``; see
    :mod:`analysis.inference.permutation_null`), ``sensitivity=True`` CKA with each side's top
    principal component removed; either also records per-layer effective dimension and top-component
    share, and warnings (:mod:`analysis.batch_statistics.flags`) in ``diagnostics``.
    """
    opts = CompareOptions.build(options, **shortcuts)
    data = load_data(data)
    plan, networks = _library_plan(models, data, opts, model_keys, siblings)
    hooks = Hooks(
        networks,
        device,
        progress,
        gram_cache,
        dataset_key,
        on_batch,
        decoded_cache=decoded_cache,
        gpu_jpeg=gpu_jpeg,
    )
    return run_comparison(plan, data, hooks)


def compare_partial(
    models: Mapping[str, nn.Module],
    data: DataLike,
    options: CompareOptions | None = None,
    *,
    batches: range,
    **kwargs: Any,
) -> Partial:
    """:func:`analysis.compare` over the batches with indices in ``batches`` only, without the
    baselines (they run after :func:`analysis.combine`: :func:`add_baselines`).

    ``kwargs`` as for ``compare``: option shortcuts, and the plumbing of
    :class:`analysis.RunSettings` (``device``, ``progress``, ``gram_cache``, ``model_keys``,
    ``on_batch``, ``dataset_key``); ``on_batch(done, total)`` counts within the range. The
    range must lie within the plan (:func:`analysis.batch_count`); ``mode="full"`` is exact
    over all samples at once, so it is refused (:class:`analysis.OptionsError`) unless the
    range is the whole plan.
    """
    settings, shortcuts = RunSettings.split(kwargs)
    opts = CompareOptions.build(options, **shortcuts)
    return run_partial(models, data, opts, batches, settings)


def add_baselines(
    atlas: Atlas,
    models: Mapping[str, nn.Module],
    data: DataLike,
    options: CompareOptions | None = None,
    *,
    siblings: Mapping[str, nn.Module] | None = None,
    model_keys: Mapping[str, str] | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    gram_cache: GramCache | None = None,
    on_batch: OnBatch | None = None,
    **shortcuts: Any,
) -> Atlas:
    """``atlas`` (of ``models``, run with ``options``, e.g. combined from shards) with the
    baselines those ask for and with them the cells' verdicts, as :func:`analysis.compare`
    adds them: the same plan, its run counted as done in ``on_batch``'s progress."""
    opts = CompareOptions.build(options, **shortcuts, layers=dict(atlas.layers))
    data = load_data(data)
    plan, networks = _library_plan(models, data, opts, model_keys, siblings)
    hooks = Hooks(networks, device, progress, gram_cache, None, on_batch)
    prog = plan.progress(on_batch)
    with networks.lease([m.key for m in plan.members] + plan.sibling_keys) as pool:
        nets = {m.label: pool[m.key] for m in plan.members}
        _baselines(plan, atlas, nets, pool, data, hooks, prog)
    prog.done()
    return atlas
