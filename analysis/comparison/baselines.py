"""Baselines that give a CKA value a reference: what architecture and input alone produce.

A baseline block is CKA between two *stand-ins*, networks that take the places of the two
models of one block of the atlas (rows: the first model's layers, columns: the second's). Every
baseline obeys one rule, held by :func:`choose`: **the two stand-ins of a block are never one
network** (equal :attr:`StandIn.identity`), so no baseline cell compares a model's layer with
that same model's layer. A baseline lists, per block, the stand-in pairs it accepts in order of
preference; :func:`choose` takes the first pair of two networks, and where there is none the
block is undefined, with the reason. :func:`substituted_cka` runs the chosen stand-ins once,
under the comparison's own options, through the run function it is given (the comparison's
own pipeline, :mod:`analysis.comparison.run`), and fills a full (L_total, L_total) matrix in
the atlas's layer order (NaN where undefined).

``random_init`` (:func:`random_init_baseline`): every model replaced by an untrained twin of its
architecture and options (:func:`random_init_twin`). Draw ``d`` of a model takes its weights
(and the SW-MLP's masks, the RP-Mixer's permutations) from its own seed, :func:`twin_seed`: the
first 8 hex digits of ``sha256("random_init|{seed}|{key}|{d}|{copy}")`` modulo 2**31, ``key``
being the model's key (its checkpoint sha256 when ``model_keys`` gives one, else its label) and
``seed`` :attr:`CompareOptions.seed`. So two models never share a twin, every draw is a new
one, and the same comparison gives the same baseline. In a model's block with itself the column
side is a second twin (``copy`` 1): two untrained networks of one architecture, the floor of the
seed-to-seed agreement. ``random_init_draws`` draws are averaged; their standard deviation
(``sd``, none for one draw), minimum and maximum are kept.

**Paired verdicts.** Given the comparison's per-image projections of its cells
(:mod:`analysis.batch_statistics.cell_image_terms`), a baseline's stand-ins run keeping theirs
too (``projections=True``), over the same images in the same order, and the baseline stores
per cell the image variance of the difference, image by image (``image_var``:
:func:`paired_image_var`): the verdicts' paired image term (:mod:`analysis.inference.verdicts`).
Where either side kept none (their cap), there is no ``image_var`` and the verdicts sum.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.atlas import Atlas
from analysis.batch_statistics.cell_image_terms import KEY as CELL_PROJECTIONS
from analysis.errors import AnalysisError
from analysis.options import CompareOptions

__all__ = [
    "TWINS_PER_MODEL",
    "Block",
    "Candidates",
    "RunAtlas",
    "StandIn",
    "Substituted",
    "choose",
    "matrix_json",
    "paired_image_var",
    "random_init_baseline",
    "random_init_twin",
    "substituted_cka",
    "twin_seed",
]

# A block of the atlas: (a, b) with a at or before b in the comparison's order.
Block = tuple[str, str]
# The options a baseline's own atlas shares with the comparison (the rest is calibration).
_SHARED = ("kernel", "estimator", "mode", "batch_size", "feature", "dtype")
# ... and, where the baseline needs its own intervals, the intervals' options.
_INTERVALS = ("interval", "resamples", "seed")
# Each random-init draw runs two twins of every model: one per side of its block with itself.
TWINS_PER_MODEL = 2
# How a baseline runs its stand-ins: their atlas under these options, their Gram-store keys (or
# None), and the run's on_batch(done, total) progress callback (or None).
OnBatch = Callable[[int, int], bool | None]
RunAtlas = Callable[
    [Mapping[str, nn.Module], CompareOptions, Mapping[str, str] | None, OnBatch | None], Atlas
]


def random_init_twin(model: nn.Module, seed: int = 0) -> nn.Module:
    """An untrained model of ``model``'s architecture and options, its weights drawn from ``seed``.

    Presets take the seed as their ``seed`` option (so the twin's ``atlas_config`` records it);
    other timm architectures are built while torch's RNG is seeded, and the caller's RNG state
    is restored afterwards. The twin is in eval mode, on the CPU. Raises :class:`AnalysisError`
    for a model that carries no ``atlas_config``.
    """
    import models  # analysis sits above models (models never imports analysis)

    cfg = _atlas_config(model)
    options = dict(cfg.get("config") or {})
    if cfg.get("family") != "timm":
        options["seed"] = seed
        twin = models.create(cfg["arch"], **options)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            twin = models.create(cfg["arch"], **options)
    return twin.eval()


def _atlas_config(model: nn.Module) -> dict[str, Any]:
    cfg: dict[str, Any] | None = getattr(model, "atlas_config", None)
    if not cfg or "arch" not in cfg:
        raise AnalysisError(
            f"{type(model).__name__} has no atlas_config; build it with models.create or "
            "load it with models.load to get a random-init twin"
        )
    return cfg


def twin_seed(key: str, draw: int, copy: int = 0, seed: int = 0) -> int:
    """The seed of draw ``draw`` (``copy`` 1: the second twin) of the model keyed ``key``."""
    text = f"random_init|{seed}|{key}|{draw}|{copy}"
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 2**31


@dataclass(frozen=True)
class StandIn:
    """A network in a compared model's place: ``label`` names it in the baseline's atlas."""

    label: str
    identity: str  # equal identities: one network
    layers: tuple[str, ...]  # the layers of the model it stands in for
    about: Mapping[str, Any] = field(compare=False)  # what it is, as JSON
    cache_key: str | None = None  # a Gram-store key (a checkpoint's sha256)


Pair = tuple[StandIn, StandIn]


@dataclass(frozen=True)
class Candidates:
    """The stand-in pairs a baseline accepts for one block, in order of preference.

    ``missing``: why the block is undefined when there is no candidate at all; ``noun``: what
    a stand-in is ("sibling", "twin"), for the reason when every candidate is one network.
    """

    pairs: tuple[Pair, ...]
    missing: str
    noun: str


def choose(blocks: Mapping[Block, Candidates]) -> dict[Block, Pair | str]:
    """Per block, the first candidate pair of two networks, or why the block is undefined.

    The one rule of every baseline: a pair whose two stand-ins are one network (a model in
    place of the other side, or one twin on both sides) is never a baseline.
    """
    out: dict[Block, Pair | str] = {}
    for block, cand in blocks.items():
        pick = next((p for p in cand.pairs if p[0].identity != p[1].identity), None)
        if pick is not None:
            out[block] = pick
        elif cand.pairs:
            out[block] = f"no {cand.noun} other than the compared model"
        else:
            out[block] = cand.missing
    return out


@dataclass(frozen=True)
class Substituted:
    """What :func:`substituted_cka` gives: the full matrix of the chosen stand-ins' CKA (NaN
    where undefined), per block what stood in (or why none), and the interval when asked."""

    cka: np.ndarray
    blocks: list[dict[str, Any]]
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None
    # (N, L_total, L_total): each image's projection of each stand-in cell, with ``projections``
    # and where the stand-ins' run kept them (NaN where undefined)
    terms: np.ndarray | None = None


def substituted_cka(
    sizes: Mapping[str, int],
    chosen: Mapping[Block, Pair | str],
    resolve: Callable[[StandIn], nn.Module],
    options: CompareOptions,
    run: RunAtlas,
    *,
    intervals: bool = False,
    projections: bool = False,
    on_batch: OnBatch | None = None,
) -> Substituted:
    """The chosen stand-ins' CKA in the comparison's layer order, and per block what stood in.

    ``sizes``: layers per model, in the comparison's order; ``resolve`` gives a stand-in's
    network; ``run`` runs them (see :data:`RunAtlas`), reporting to ``on_batch``;
    ``intervals``: also their 95 % intervals, as ``options`` ask for them; ``projections``:
    also each image's projection of each cell (``terms``; the run keeps them under image
    intervals and the comparison's baselines, within their cap).
    """
    starts = dict(zip(sizes, np.cumsum([0, *sizes.values()]).tolist(), strict=False))
    total = sum(sizes.values())
    full = np.full((total, total), np.nan)
    low, high = np.full((total, total), np.nan), np.full((total, total), np.nan)
    stand_ins: dict[str, StandIn] = {}
    for pick in chosen.values():
        for s in () if isinstance(pick, str) else pick:
            if stand_ins.setdefault(s.label, s) != s:
                raise AnalysisError(f"two stand-ins are labelled {s.label!r}")
    described: list[dict[str, Any]] = []
    shared = _SHARED + (_INTERVALS if intervals else ())
    paired: dict[str, Any] = {}
    if projections:  # what makes the run keep its cells' projections (cell_image_terms)
        paired = {"interval": "images", "baselines": options.baselines}
    if stand_ins:
        own = CompareOptions.build(
            **({k: getattr(options, k) for k in shared} | paired),
            null="none",  # a baseline is a reference value, not a test
            layers={lb: s.layers for lb, s in stand_ins.items()},
        )
        keys = {lb: s.cache_key for lb, s in stand_ins.items() if s.cache_key}
        atlas = run({lb: resolve(s) for lb, s in stand_ins.items()}, own, keys or None, on_batch)
    found = atlas.values.pop(CELL_PROJECTIONS, None) if stand_ins and projections else None
    terms = None if found is None else np.full((len(found), total, total), np.nan)
    for (a, b), pick in chosen.items():
        if isinstance(pick, str):
            described.append({"a": a, "b": b, "reason": pick})
            continue
        row, col = pick
        ra, rb = slice(starts[a], starts[a] + sizes[a]), slice(starts[b], starts[b] + sizes[b])
        parts = [(full, atlas.matrix(row.label, col.label))]
        ci = atlas.interval(row.label, col.label)
        if ci is not None:
            parts += [(low, ci[0]), (high, ci[1])]
        for target, block in parts:
            target[ra, rb] = block
            if a != b:
                target[rb, ra] = block.T
        if terms is not None and found is not None:
            block = found[:, _rows(atlas, row.label), _rows(atlas, col.label)]
            terms[:, ra, rb] = block
            if a != b:
                terms[:, rb, ra] = block.transpose(0, 2, 1)
        pair = {"rows": _about(row), "columns": _about(col)}
        described.append({"a": a, "b": b, "stand_ins": [pair]})
    with_ci = intervals and stand_ins and atlas.ci_low is not None
    return Substituted(full, described, low if with_ci else None, high if with_ci else None, terms)


def paired_image_var(cell: np.ndarray, baseline: np.ndarray) -> list[list[float | None]]:
    """Per cell, ``Σ_a (φ_a − φ'_a)²`` over the images of the comparison's projections
    ``cell`` and a baseline's ``baseline`` (both (N, L, L)), as JSON (None where undefined)."""
    if cell.shape != baseline.shape:
        raise AnalysisError(
            f"the baseline's projections have shape {baseline.shape}, the comparison's "
            f"{cell.shape}: paired differences need the same images and layers"
        )
    var = np.sum((cell - baseline) ** 2, axis=0)
    return matrix_json(np.where(np.isfinite(var), var, np.nan))


def _rows(atlas: Atlas, label: str) -> slice:
    """Where the layers of model ``label`` lie among ``atlas``'s layers."""
    start = sum(len(atlas.layers[m]) for m in atlas.models[: atlas.models.index(label)])
    return slice(start, start + len(atlas.layers[label]))


def _about(s: StandIn) -> dict[str, Any]:
    return {**s.about, "identity": s.identity}


def _twin(label: str, net: nn.Module, layers: Sequence[str], seed: int) -> StandIn:
    cfg = _atlas_config(net)
    options = sorted((k, repr(v)) for k, v in (cfg.get("config") or {}).items() if k != "seed")
    what = repr((cfg["arch"], options, seed))
    return StandIn(
        label=f"untrained {label} (seed {seed})",
        identity="untrained:" + hashlib.sha256(what.encode()).hexdigest(),
        layers=tuple(layers),
        about={"untrained": label, "arch": cfg["arch"], "seed": seed},
    )


def random_init_baseline(
    nets: Mapping[str, nn.Module],
    options: CompareOptions,
    *,
    layers: Mapping[str, Sequence[str]],
    run: RunAtlas,
    model_keys: Mapping[str, str] | None = None,
    on_draw: Callable[[int], OnBatch | None] | None = None,
    projections: np.ndarray | None = None,
) -> dict[str, Any]:
    """The random-init baseline of ``nets`` (see the module doc), as JSON.

    ``layers``: the resolved layer names of each model (the atlas's ``layers``); ``options``:
    the comparison's (``random_init_draws`` among them); ``run``: how stand-ins run
    (:data:`RunAtlas`). ``on_draw(d)`` gives the ``on_batch`` callback of draw ``d`` (progress,
    cancellation). ``projections``: the comparison's (N, L, L) per-image projections of its
    cells, for the paired ``image_var`` (module doc).
    Returns ``cka`` (the mean over draws), ``sd``, ``min``, ``max`` (full matrices, None
    where undefined), ``draws``, the per-model ``seeds`` and per block what stood in.
    """
    opts = options
    order = list(nets)
    sizes = {m: len(layers[m]) for m in order}
    keys = {m: (model_keys or {}).get(m, m) for m in order}
    blocks = [(a, b) for i, a in enumerate(order) for b in order[i:]]
    seeds: dict[str, list[int]] = {m: [] for m in order}
    merged: dict[Block, dict[str, Any]] = {(a, b): {"a": a, "b": b} for a, b in blocks}
    runs = []
    drawn_terms: list[np.ndarray | None] = []

    def resolve(s: StandIn) -> nn.Module:
        return random_init_twin(nets[s.about["untrained"]], seed=s.about["seed"])

    for d in range(opts.random_init_draws):
        twins = [
            {m: _twin(m, nets[m], layers[m], twin_seed(keys[m], d, copy, opts.seed)) for m in order}
            for copy in range(TWINS_PER_MODEL)
        ]
        for m in order:
            seeds[m].append(twins[0][m].about["seed"])
        candidates = {
            (a, b): Candidates(
                ((twins[0][a], twins[0][b]), (twins[0][a], twins[1][b])), "no twin", "twin"
            )
            for a, b in blocks
        }
        drawn = substituted_cka(
            sizes,
            choose(candidates),
            resolve,
            opts,
            run,
            projections=projections is not None,
            on_batch=None if on_draw is None else on_draw(d),
        )
        runs.append(drawn.cka)
        if projections is not None:
            drawn_terms.append(drawn.terms)
        for item in drawn.blocks:
            slot = merged[item["a"], item["b"]]
            if "reason" in item:  # undefined in one draw: undefined
                slot["reason"] = item["reason"]
            else:
                slot.setdefault("stand_ins", []).extend(item["stand_ins"])
    stack = np.stack(runs)
    sd = np.std(stack, axis=0, ddof=1) if len(runs) > 1 else np.full(stack.shape[1:], np.nan)
    out = {
        "draws": len(runs),
        "cka": matrix_json(stack.mean(axis=0)),
        "sd": matrix_json(sd),
        "min": matrix_json(stack.min(axis=0)),
        "max": matrix_json(stack.max(axis=0)),
        "seeds": seeds,
        "blocks": [merged[blk] for blk in blocks],
    }
    kept = [t for t in drawn_terms if t is not None]
    if projections is not None and kept and len(kept) == len(drawn_terms):
        out["image_var"] = paired_image_var(projections, np.mean(np.stack(kept), axis=0))
    return out


def matrix_json(a: np.ndarray) -> list[list[float | None]]:
    """A matrix as JSON lists, None where the value is not finite (undefined)."""
    return [[float(v) if np.isfinite(v) else None for v in row] for row in a]
