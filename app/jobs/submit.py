"""Turning a request into a queued job: up-front validation and idempotent creation.

Everything that can be wrong with a comparison is found here, before any work is queued:
unknown models or dataset, a batch too small for the unbiased estimator, a dataset whose
images do not fit a model, a layer selection that resolves to nothing. An identical request
(same checkpoints, dataset content and options) returns the stored comparison; the unique
``request_hash`` makes that hold under concurrent requests too.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any

import torch
from cachetools import LRUCache, cached
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from analysis import AnalysisError, comparison_bytes, describe_bytes
from analysis.layers import LayerReader, check_feature, resolve_layers
from analysis.options import CompareOptions, OptionsError
from analysis.studies import training_key
from app.errors import ProblemError
from app.jobs.cancel import Requester, lock_job, record
from app.jobs.queue import enqueue
from app.jobs.requests import ComparisonIn, TrainingIn
from app.store import repository
from app.store.checkpoints import refuse_loader_options
from app.store.datasets import dataset_key
from app.store.orm import Comparison, ComparisonModel, Dataset, JobState, Model, Training
from app.store.services import Services

__all__ = [
    "check_config",
    "check_model_budget",
    "skeleton",
    "submit_comparison",
    "submit_training",
    "training_identity",
]

# Limits on what one comparison may ask of a worker, checked before anything is queued: the
# per-batch Gram matrices (float64 worst case, all selected layers of all models at once), the
# bootstrap's (replicates, L, L) arrays, and the number of selected layers (the result holds
# L² cells). Past them a request is refused with the field to change, not left to exhaust the
# worker's memory.
MEMORY_BUDGET_BYTES = 4 << 30
MAX_TOTAL_LAYERS = 1024


def _skeleton_key(arch: str, config: dict[str, Any]) -> str:
    import models

    return json.dumps([arch, models.shape_config(config)], sort_keys=True, default=str)


@cached(LRUCache(maxsize=64), key=_skeleton_key, lock=threading.Lock())
def skeleton(arch: str, config: dict[str, Any]) -> Any:
    """A weightless instance of an architecture (meta device), for layer names and shapes;
    one per shape (:func:`models.shape_config`), whatever the seed."""
    import models

    shapes = models.shape_config(config)
    try:
        with torch.device("meta"):
            net = models.create(arch, **shapes)
    except (NotImplementedError, RuntimeError):
        net = models.create(arch, **shapes)
    return net.eval()


# Where a refusal of a model's name sends the client: over REST, and on the command line.
MODELS_LISTING = "GET /v1/models lists the models (?q=NAME finds names and aliases)"
COMMAND_LISTING = "`cka-atlas models` lists the store's models"


def _invalid(code: str, detail: str, field: str) -> ProblemError:
    return ProblemError(422, code, detail, field=field)


def check_model_budget(
    services: Services,
    arch: str,
    config: dict[str, Any],
    *,
    batch_size: int,
    training: bool,
    field: str,
) -> None:
    """422 when the model would need more memory than CKA_MAX_MODEL_BYTES (models.check_budget).

    A budget is a matter of shapes, which no seed changes: the sizes of a configuration (kept
    per process by ``models.check_budget``, under :func:`models.shape_config`) serve all its
    seeds.
    """
    import models

    try:
        models.check_budget(
            arch,
            config,
            batch_size=batch_size,
            max_bytes=services.settings.max_model_bytes,
            training=training,
        )
    except models.ConfigError as exc:
        raise _invalid("model_too_large", str(exc), field) from None


def _labels(rows: list[Model]) -> list[str]:
    names = [m.name for m in rows]
    return [m.name if names.count(m.name) == 1 else f"{m.name}#{m.id}" for m in rows]


def _resolve(row: Model, selection: Any) -> list[str]:
    net = skeleton(row.arch, row.config)
    try:
        return list(
            resolve_layers(
                net,
                selection,
                model_name=f"model {row.id} ({row.name})",
                listing=f"GET /v1/models/{row.id}/layers lists them all",
            )
        )
    except AnalysisError as exc:
        raise _invalid("invalid_layers", str(exc), "layers") from None


def validate_comparison(
    services: Services, body: ComparisonIn
) -> tuple[list[Model], Dataset, dict[str, Any]]:
    """Check the request against the database; returns rows and the canonical params (models
    by id, however the request named them)."""
    with services.db.session(readonly=True) as s:
        rows = [
            repository.model_by_reference(s, ref, listing=MODELS_LISTING, field=f"model_ids.{i}")
            for i, ref in enumerate(body.model_ids)
        ]
        ds = s.get(Dataset, body.dataset_id)
    body = body.model_copy(update={"model_ids": [row.id for row in rows]})
    if len(set(body.model_ids)) != len(body.model_ids):
        raise _invalid("duplicate_model", "model_ids lists a model twice", "model_ids")
    try:  # the rules between options (batch size per estimator, …) live in CompareOptions
        options = CompareOptions.build(body.options())
    except (OptionsError, ValidationError) as exc:  # a body built in code, not over REST
        error = OptionsError.from_validation(exc) if isinstance(exc, ValidationError) else exc
        raise _invalid(error.kind, str(error), error.field) from None
    if body.shards > 1 and body.mode != "minibatch":
        raise _invalid(
            "shards_need_minibatch",
            f"shards {body.shards} need mode minibatch (mode full keeps every sample in one place)",
            "shards",
        )
    if ds is None:
        raise _invalid("unknown_dataset", f"dataset {body.dataset_id} does not exist", "dataset_id")
    min_n = 4 if body.estimator == "unbiased" else 2
    if ds.n < min_n:
        raise _invalid("dataset_too_small", f"the dataset has {ds.n} images", "dataset_id")
    for i, row in enumerate(rows):
        check_model_budget(
            services,
            row.arch,
            row.config,
            batch_size=min(body.batch_size, ds.n),
            training=False,
            field=f"model_ids.{i}",
        )
    for row in rows:
        try:  # before anything is queued: a missing class token fails every batch later
            check_feature(skeleton(row.arch, row.config), options.feature, _who(row))
        except AnalysisError as exc:
            raise _invalid("feature_needs_class_token", str(exc), "feature") from None
    labels = _labels(rows)
    resolved = {label: _resolve(row, body.layers) for label, row in zip(labels, rows, strict=True)}
    _check_size(body, options, ds, sum(len(names) for names in resolved.values()))
    # what the job will hold, before anything is queued: the measures against their budget,
    # the whole comparison against the job's
    widths = [
        w
        for label, row in zip(labels, rows, strict=True)
        for w in _widths(row, resolved[label], options)
    ]
    if options.whole_sample:
        try:
            options.check_memory(ds.n, widths)
        except OptionsError as exc:
            raise _invalid(exc.kind, str(exc), exc.field) from None
    _check_job_memory(services, options, ds, widths)
    params = comparison_params(body, options, labels, resolved, ds.id)
    return rows, ds, params


# The request field that most moves each part of a comparison's memory (analysis.comparison_bytes).
_MEMORY_FIELDS = {
    "images": "dataset_id",
    "activations": "batch_size",
    "grams": "batch_size",
    "kept": "measures",
    "bootstrap": "resamples",
    "permutations": "permutations",
}


def _check_job_memory(
    services: Services, options: CompareOptions, ds: Dataset, widths: list[int]
) -> None:
    """Refuse a comparison that would hold more than ``CKA_JOB_MEMORY_GB`` at its peak."""
    parts = comparison_bytes(options, ds.n, ds.shape, widths)
    budget = services.settings.job_memory_bytes
    if sum(parts.values()) > budget:
        largest = max(parts, key=lambda k: parts[k])
        raise _invalid(
            "job_too_large",
            f"this comparison would hold {describe_bytes(parts)} at its peak, more than the "
            f"{_gib(budget)} a job may (CKA_JOB_MEMORY_GB); use fewer images, smaller batches, "
            "fewer layers or models, or fewer measures",
            _MEMORY_FIELDS[largest],
        )


def _widths(row: Model, layers: list[str], options: CompareOptions) -> list[int]:
    """The features per image of each of ``layers`` of ``row``: one image through the model's
    weightless skeleton (meta tensors: shapes only, nothing computed)."""
    net = skeleton(row.arch, row.config)
    device = next(net.parameters()).device
    with torch.inference_mode():
        x = torch.zeros(1, *row.input_shape, device=device)
        return [int(f[0].numel()) for f in LayerReader(net, layers, options.feature)(x)]


def _who(row: Model) -> str:
    return f"model {row.id} ({row.name})"


def comparison_params(
    body: ComparisonIn,
    options: CompareOptions,
    labels: list[str],
    resolved: dict[str, list[str]],
    dataset_id: int,
) -> dict[str, Any]:
    """The stored params of a comparison: what to compare, every option as validated
    (canonical: permutations mean the permutation null, baselines an interval, full mode no
    null), and how it runs (``shards``, not part of what it computes)."""
    values = options.model_dump(mode="json", exclude={"layers", "bootstrap"})
    if "random_init" not in options.baselines:
        # Only the random-init baseline draws twins: without it the count changes nothing.
        values["random_init_draws"] = None
    return {
        "model_ids": body.model_ids,
        "labels": labels,
        "dataset_id": dataset_id,
        "layers": body.layers,
        "resolved_layers": resolved,
        **values,
        "shards": body.shards,
    }


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _check_size(body: ComparisonIn, options: CompareOptions, ds: Dataset, layers: int) -> None:
    """Refuse a comparison whose Grams, bootstrap or result would not fit a worker."""
    if layers > MAX_TOTAL_LAYERS:
        raise _invalid(
            "too_many_layers",
            f"the selection picks {layers} layers over all models, more than the "
            f"{MAX_TOTAL_LAYERS} allowed; select fewer layers or models",
            "layers",
        )
    full = body.mode == "full"
    b = ds.n if full else min(body.batch_size, ds.n)
    grams = layers * b * b * 8
    if grams > MEMORY_BUDGET_BYTES:
        what = f"all {ds.n} images at once (mode full)" if full else f"batch_size {b}"
        raise _invalid(
            "batch_too_large",
            f"{what} over {layers} layers needs about {_gib(grams)} of Gram matrices, more "
            f"than the {_gib(MEMORY_BUDGET_BYTES)} allowed; "
            + ("use mode minibatch" if full else "lower batch_size or select fewer layers"),
            "mode" if full else "batch_size",
        )
    boot = options.resamples * layers * layers * 8 * 3 if options.interval == "batches" else 0
    if boot > MEMORY_BUDGET_BYTES:
        raise _invalid(
            "bootstrap_too_large",
            f"{options.resamples} bootstrap resamples over {layers} layers need about "
            f"{_gib(boot)}, more than the {_gib(MEMORY_BUDGET_BYTES)} allowed; use fewer "
            "resamples, interval images, or select fewer layers",
            "resamples",
        )
    null = body.permutations * layers * layers * 8
    if null > MEMORY_BUDGET_BYTES:
        raise _invalid(
            "permutations_too_large",
            f"{body.permutations} permutations over {layers} layers need about {_gib(null)}, "
            f"more than the {_gib(MEMORY_BUDGET_BYTES)} allowed; use fewer permutations or "
            "select fewer layers",
            "permutations",
        )


# Options that a request written before they existed leaves out; their defaults hash as absent,
# so such a request still finds the comparison stored for it.
_UNSET: dict[str, Any] = {"permutations": 0, "sensitivity": False, "baselines": []}
_UNSET |= {"random_init_draws": None, "dtype": "fp32", "seed": 0}
_UNSET |= {"measures": ["cka"], "knn_k": 10}
# What every request hashed, from the first release on.
_ALWAYS = ("resolved_layers", "kernel", "estimator", "mode", "batch_size", "feature")


def request_hash(rows: list[Model], ds: Dataset, params: dict[str, Any]) -> str:
    """The identity of a request: checkpoints, dataset content and every option, written so
    that a request means what it meant before an option existed (a stored comparison is found
    by the same request again)."""
    # Before the null option, a request had the permutation null with permutations, else none.
    unset = _UNSET | {"null": "permutation" if params.get("permutations") else "none"}
    interval = params["interval"]
    canonical = {
        "checkpoints": [m.sha256 for m in rows],
        "dataset": ds.sha256,
        **{k: params[k] for k in _ALWAYS},
        # Before interval and resamples, one number said both: 0 for none, N for intervals
        # (image-level: the only unit a request could ask for).
        "bootstrap": 0 if interval == "none" else params["resamples"],
        **{k: v for k, v in params.items() if unset.get(k, v) != v},
    }
    if interval == "batches":
        canonical["interval"] = interval
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def _joined(session: Session, existing: Comparison, requester: Requester | None) -> bool:
    """Whether a request joins the identical ``existing`` comparison (its requester recorded
    while the job is live), rather than computing it again: not when forced (the caller's
    check), failed, cancelled, or on its way to being cancelled."""
    job = lock_job(session, existing.job_id)
    if job is None or job.status in (JobState.FAILED, JobState.CANCELLED) or job.cancel_requested:
        return False
    if requester is not None and job.status.live:
        record(session, job.id, requester)
    return True


def submit_comparison(
    services: Services,
    body: ComparisonIn,
    *,
    dispatch: bool = True,
    parent_id: int | None = None,
    requester: Requester | None = None,
) -> tuple[int, bool]:
    """Queue a comparison, or find the identical one. Returns (comparison id, created).

    ``dispatch=False`` leaves the queued job to the caller; ``parent_id``: a new comparison's
    job is a child of that job (a study's atlas). ``requester`` is recorded as holding the
    job, a new one or the identical one still queued or running (:mod:`app.jobs.cancel`);
    None: the service itself, which only an admin may cancel.
    """
    rows, ds, params = validate_comparison(services, body)
    digest = request_hash(rows, ds, params)
    try:
        with services.db.session() as s:
            existing = repository.find_comparison_by_hash(s, digest)
            if existing is not None:
                if not body.force and _joined(s, existing, requester):
                    return existing.id, False
                existing.request_hash = None  # superseded; stays readable by id
                s.flush()
            job = enqueue(s, "comparison", parent_id=parent_id)
            if requester is not None:
                record(s, job.id, requester)
            cmp = Comparison(
                request_hash=digest,
                params=params,
                dataset_id=ds.id,
                job_id=job.id,
                kernel=params["kernel"],
                members=[
                    ComparisonModel(position=i, model_id=row.id, label=label)
                    for i, (row, label) in enumerate(zip(rows, params["labels"], strict=True))
                ],
            )
            s.add(cmp)
            s.flush()
            cmp_id, job_id = cmp.id, job.id
    except IntegrityError:  # an identical request committed first
        with services.db.session() as s:
            found = repository.find_comparison_by_hash(s, digest)
            if found is None:
                raise
            _joined(s, found, requester)  # queued a moment ago: recorded as its requester
            return found.id, False
    if dispatch:
        services.dispatch(job_id)
    return cmp_id, True


_OPTION_IN_MESSAGE = re.compile(r"option '([A-Za-z0-9_]{1,64})'")


def check_config(arch: str, config: dict[str, Any], field: str = "config") -> dict[str, Any]:
    """The full validated options of ``arch`` (models.validate_config), or a 422.

    The problem's ``field`` is ``config.KEY`` for the option the sentence names (an unknown
    key, a wrong type, a value out of range), ``arch`` for an unknown architecture.
    """
    import models
    from models.schema import ALIASES

    refuse_loader_options(config, field)
    try:
        return models.validate_config(arch, config)
    except models.ConfigError as exc:
        message = str(exc)
        if message.startswith("unknown architecture"):
            raise _invalid("invalid_architecture", message, "arch") from None
        found = _OPTION_IN_MESSAGE.search(message)
        key = found.group(1) if found else None
        if key is not None and key not in config:  # reported under its canonical name
            key = next((k for k in config if ALIASES.get(k) == key), key)
        raise _invalid("invalid_config", message, f"{field}.{key}" if key else field) from None


def training_identity(
    services: Services, ds: Dataset, body: TrainingIn, given: dict[str, Any]
) -> str | None:
    """The training key of this request, as a study would compute it for the same training
    (:func:`analysis.studies.training_key`), so that a study reuses the model; None for a
    timm architecture or options that do not fit the dataset's images."""
    import models

    if body.arch not in models.list_presets():
        return None
    data = services.datasets.get(f"builtin:{ds.spec}:train" if ds.builtin else dataset_key(ds))
    channels, height, width = data.shape
    fixed: dict[str, Any] = {"in_chans": channels}
    if height == width:
        fixed["img_size"] = height
    if data.num_classes:
        fixed["num_classes"] = data.num_classes
    try:
        config = models.validate_config(body.arch, {**fixed, **given})
        family = models.structure(body.arch, config)["family"]
    except models.ConfigError:
        return None
    base = models.recipe(family)
    recipe = {
        "epochs": body.epochs,
        "batch_size": body.batch_size or base.batch_size,
        "lr": float(body.lr or base.lr),
        "weight_decay": float(base.weight_decay),
    }
    seeded = {**config, "seed": body.seed}
    return training_key(body.arch, seeded, body.seed, data.sha256, recipe)


def submit_training(
    services: Services,
    body: TrainingIn,
    requester: Requester | None = None,
    *,
    parent_id: int | None = None,
    dispatch: bool = True,
) -> int:
    """Queue a training; ``requester`` holds its job, ``parent_id`` and ``dispatch`` as for
    :func:`submit_comparison` (the demo's trainings are its children)."""
    import models

    with services.db.session(readonly=True) as s:
        ds = s.get(Dataset, body.dataset_id)
    if ds is None:
        raise _invalid("unknown_dataset", f"dataset {body.dataset_id} does not exist", "dataset_id")
    if not ds.builtin and ds.classes is None:
        raise _invalid(
            "dataset_unlabelled",
            f"dataset {ds.id} ({ds.name}) has no labels, so no model can be trained on it "
            "(training needs its images in one folder per class, or an .npz with y; "
            "comparing needs no labels)",
            "dataset_id",
        )
    config = check_config(body.arch, dict(body.config))
    try:
        net = skeleton(body.arch, config)
    except Exception as exc:
        raise _invalid(
            "invalid_architecture", f"cannot build {body.arch!r}: {exc}", "arch"
        ) from None
    spec = models.input_spec(net)
    shape = [int(spec.channels), int(spec.height), int(spec.width)]
    if shape != list(ds.shape):
        raise _invalid(
            "shape_mismatch",
            f"{body.arch} takes images of shape {tuple(shape)}, dataset {ds.id} has "
            f"{tuple(ds.shape)}",
            "dataset_id",
        )
    owner = models.family_of(body.arch)
    batch = body.batch_size or models.recipe("timm" if owner is None else owner.name).batch_size
    check_model_budget(services, body.arch, config, batch_size=batch, training=True, field="config")
    params = body.model_dump(exclude={"arch", "dataset_id", "config"})
    params["config"] = {**config, "seed": body.seed} if "seed" in config else config
    with services.db.session() as s:
        job = enqueue(s, "training", parent_id=parent_id)
        if requester is not None:
            record(s, job.id, requester)
        tr = Training(
            arch=body.arch,
            dataset_id=ds.id,
            params=params,
            job_id=job.id,
            training_key=training_identity(services, ds, body, dict(body.config)),
        )
        s.add(tr)
        s.flush()
        tr_id, job_id = tr.id, job.id
    if dispatch:
        services.dispatch(job_id)
    return tr_id
