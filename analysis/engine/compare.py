"""The streaming all-pairs CKA engine: K models, one forward pass each per batch.

:func:`compare` validates its options as one :class:`analysis.CompareOptions` and hands them
to :class:`analysis.engine.streaming.StreamingRun`, which resolves every model's layers before any
forward pass and runs the loop. Per batch, every selected layer of every model becomes a raw
Gram (fp32, or float64 for a float64 model); one matrix product over the stacked centred Grams
gives the (L_total, L_total) HSIC terms of the batch (with the Gram store, one product per pair
of models, so stored pairs are reused), and the only host transfer of the batch is that small
float64 matrix. Terms are summed over batches in float64, so memory does not grow with n
(``bootstrap`` keeps the per-batch terms: ``batches × L_total²`` floats).

A comparison is :func:`analysis.shards.shard.combine` of one :class:`analysis.shards.shard.Partial`
over the whole batch plan; the plan can also be run in ranges of batches on different
workers and combined to the same atlas (:mod:`analysis.shards.shard`). Its ``baselines`` run after
it (:func:`add_baselines`): the random-init twins (:mod:`analysis.inference.baselines`) and the seed
ceiling (:mod:`analysis.inference.seed_ceiling`), each through the same pipeline; the atlas then
carries each cell's verdicts (:mod:`analysis.inference.verdicts`).

Progress counts every phase: ``on_batch(done, total)`` counts batches weighted by the networks
each phase runs (the compared models, every random-init draw's twins, the ceiling's stand-ins),
so ``done == total`` only after the last batch of the last phase.

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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.atlas import Atlas
from analysis.data.sources import DataLike
from analysis.engine.batches import sum_batches
from analysis.engine.gram_cache import GramCache
from analysis.engine.streaming import RunSettings, full_hsic, selected_layers
from analysis.errors import EstimatorError
from analysis.estimators.hsic import MIN_SAMPLES, cka_from_hsic, hsic_from_grams
from analysis.estimators.kernels import Kernel, gram
from analysis.inference.baselines import TWINS_PER_MODEL, random_init_baseline
from analysis.inference.seed_ceiling import (
    AMONG_THE_MODELS,
    CeilingPlan,
    Identity,
    plan_ceiling,
    seed_ceiling_baseline,
    stand_ins,
    undefined_blocks,
)
from analysis.options import CompareOptions
from analysis.shards.shard import combine, run_partial

__all__ = ["add_baselines", "cka_from_features", "compare", "phase_weights"]

OnBatch = Callable[[int, int], bool | None]


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
    siblings: Mapping[str, nn.Module] | None = None,
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
    (``"bf16"``/``"fp16"``) autocasts the forward pass; Grams stay fp32. ``interval="images"``
    adds image-level 95 % intervals, ``interval="batches"`` percentile intervals from
    ``resamples`` minibatch resamples (seeded with ``seed``).

    ``baselines=("random_init", "seed_ceiling")`` adds untrained twins of every model and, for
    a model with a seed sibling among ``models`` or ``siblings`` (networks that are only
    candidates, never compared), the sibling in its place; each cell then has its verdicts
    (:meth:`Atlas.verdicts`), and ``interval`` ``"none"`` becomes ``"images"``. A sibling is the
    same architecture and options with another seed, trained on the same data as recorded by
    :func:`models.load` (see :mod:`analysis.inference.seed_ceiling`); ``model_keys`` may name
    siblings too.

    The rest is plumbing. ``gram_cache`` with ``model_keys`` (a stable identity per model,
    e.g. its checkpoint sha256) reuses stored Grams instead of running a model;
    ``dataset_key`` names a DataLoader's data for that purpose (tensors and datasets are
    hashed). ``on_batch(done, total)`` is called after every batch of every phase, counting
    batches weighted by the networks each phase runs (``total`` is 0 when unknown); returning
    False stops with :class:`analysis.Cancelled`. Models are moved to
    ``device`` (default: CUDA if available) and run in eval mode; their mode is restored.

    Calibration (minibatch mode): ``permutations=P`` adds a permutation null per cell from
    the same Grams (p-values, null mean and 95 % quantile, seeded with ``seed``; see
    :mod:`analysis.inference.permutation_null`), ``sensitivity=True`` CKA with each side's top
    principal component removed; either also records per-layer effective dimension and top-component
    share, and warnings (:mod:`analysis.inference.flags`) in ``diagnostics``.
    """
    settings = RunSettings(device, progress, gram_cache, model_keys, on_batch, dataset_key)
    opts = CompareOptions.build(options, **shortcuts)
    if not opts.baselines:
        return combine([run_partial(models, data, opts, None, settings)])
    ceiling = None
    keys = dict(model_keys or {})
    pool: dict[str, nn.Module] = {}
    if "seed_ceiling" in opts.baselines:
        members = {m: Identity.of_model(m, net, keys.get(m)) for m, net in models.items()}
        candidates = [i for i in members.values() if i is not None]
        pool |= {i.key: models[m] for m, i in members.items() if i is not None}
        for name, net in (siblings or {}).items():
            ident = Identity.of_model(name, net, keys.get(name))
            if ident is not None:
                candidates.append(ident)
                pool[ident.key] = net
        layers = selected_layers(models, opts)  # fails before any forward pass, as the run's
        ceiling = plan_ceiling(members, layers, candidates, AMONG_THE_MODELS)
    phases = Phases(on_batch, phase_weights(len(models), opts, ceiling))
    main = replace(settings, on_batch=phases.callback(0))
    atlas = combine([run_partial(models, data, opts, None, main)])
    return add_baselines(
        atlas,
        models,
        data,
        opts,
        ceiling=ceiling,
        pool=pool,
        model_keys={m: k for m, k in keys.items() if m in models},
        device=device,
        progress=progress,
        gram_cache=gram_cache,
        on_batch=on_batch,
    )


def phase_weights(members: int, options: CompareOptions, ceiling: CeilingPlan | None) -> list[int]:
    """The networks each phase of a comparison runs over the batch plan: the ``members``, then
    the random-init twins of every draw, then the seed ceiling's stand-ins (those asked for)."""
    weights = [members]
    if "random_init" in options.baselines:
        weights.append(TWINS_PER_MODEL * members * options.random_init_draws)
    if ceiling is not None and "seed_ceiling" in options.baselines:
        weights.append(stand_ins(ceiling.chosen))
    return weights


@dataclass
class Phases:
    """``on_batch(done, total)`` over several phases that each run the same batch plan: phase
    ``k``'s batches weigh ``weights[k]`` (its networks), so a caller's fraction done moves at
    the rate the work does and is 1 only at the end of the last phase."""

    on_batch: OnBatch | None
    weights: list[int]

    def callback(self, k: int) -> OnBatch | None:
        """Phase ``k``'s callback: its (done, total) batches as work of all the phases."""
        if self.on_batch is None:
            return None
        report = self.on_batch
        before, whole = sum(self.weights[:k]), sum(self.weights)

        def on_batch(done: int, total: int) -> bool | None:
            if not total:  # an iterable of unknown length: count batches as they come
                return report(done, 0)
            return report(before * total + self.weights[k] * done, whole * total)

        return on_batch


def add_baselines(
    atlas: Atlas,
    models: Mapping[str, nn.Module],
    data: DataLike,
    options: CompareOptions | None = None,
    *,
    ceiling: CeilingPlan | None = None,
    pool: Mapping[str, nn.Module] | None = None,
    model_keys: Mapping[str, str] | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    gram_cache: GramCache | None = None,
    on_batch: OnBatch | None = None,
    **shortcuts: Any,
) -> Atlas:
    """``atlas`` (of ``models``, run with ``options``) with the baselines those ask for, and
    with them the cells' verdicts: ``atlas.baselines``, the diagnostics' ``undefined_baselines``
    and ``siblings``, and one warning per baseline and reason a block is undefined.

    The random-init twins are drawn from the models themselves (seeded by ``model_keys``, see
    :mod:`analysis.inference.baselines`); the seed ceiling follows ``ceiling``
    (:func:`analysis.inference.seed_ceiling.plan_ceiling`; without it none is computed), its
    siblings taken from ``pool`` (by key) or ``models``. ``on_batch`` reports progress as
    :func:`compare` does, the comparison itself counted as done (a sharded comparison's
    baselines run after its shards are combined).
    """
    opts = CompareOptions.build(options, **shortcuts)
    phases = Phases(on_batch, phase_weights(len(models), opts, ceiling))
    layers = {m: list(atlas.layers[m]) for m in atlas.models}
    nets = {m: models[m] for m in atlas.models}
    stored: dict[str, Any] = {}
    phase = 1
    if "random_init" in opts.baselines:
        draws, start = opts.random_init_draws, phase
        per_draw = Phases(phases.callback(start), [1] * draws)  # the draws share their phase evenly
        stored["random_init"] = random_init_baseline(
            nets,
            data,
            opts,
            layers=layers,
            model_keys=model_keys,
            device=device,
            progress=progress,
            on_draw=per_draw.callback,
        )
        phase += 1
    if ceiling is not None and "seed_ceiling" in opts.baselines:
        stored["seed_ceiling"] = seed_ceiling_baseline(
            nets,
            layers,
            ceiling.chosen,
            dict(pool or {}),
            data,
            opts,
            device=device,
            progress=progress,
            gram_cache=gram_cache,
            on_batch=phases.callback(phase),
        )
        atlas.diagnostics["siblings"] = {
            label: [s.describe() for s in sibs] for label, sibs in ceiling.siblings.items()
        }
    atlas.baselines = stored
    if undefined := undefined_blocks(stored):
        atlas.diagnostics["undefined_baselines"] = undefined
        atlas.diagnostics["warnings"] = [
            *atlas.diagnostics.get("warnings", []),
            *_undefined_warnings(undefined),
        ]
    return atlas


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
