"""Model and dataset pages, and the dataset sample images they show."""

from __future__ import annotations

import hashlib
import threading
from functools import cache
from typing import Any

import numpy as np
from cachetools import LRUCache
from fastapi import APIRouter, Request
from fastapi.responses import Response
from PIL import Image
from sqlalchemy.orm import Session

from analysis.data.images import thumbnail
from analysis.data.peek import DatasetPeek, peek_dataset
from app.http.api.views import comparison_view
from app.http.web.common import Auth, as_text, found, lookup, paged, services_of
from app.http.web.rendering import render
from app.http.web.samples import render_sample
from app.store import repository
from app.store.datasets import dataset_key
from app.store.orm import Dataset, Model

__all__ = ["SAMPLES", "model_facts", "router", "sample_indices"]

router = APIRouter(include_in_schema=False)
SAMPLES = 12


def _metric(sidecar: dict[str, Any], split: str, key: str) -> Any:
    metrics = sidecar.get("metrics") or {}
    part = metrics.get(split) if isinstance(metrics, dict) else None
    return part.get(key) if isinstance(part, dict) else None


@cache
def _preset_defaults(arch: str) -> dict[str, Any]:
    import models

    try:
        return models.validate_config(arch, {})
    except models.ModelError:  # not a preset of ours (a timm name): no defaults to diff from
        return {}


def _options(row: Model) -> dict[str, Any]:
    """The options in which a model differs from its preset's defaults (its seed aside)."""
    defaults = _preset_defaults(row.arch)
    config = row.config if isinstance(row.config, dict) else {}
    return {k: v for k, v in config.items() if k != "seed" and k in defaults and defaults[k] != v}


def model_facts(row: Model) -> dict[str, Any]:
    """What a researcher wants first about a checkpoint, from its row and sidecar."""
    side = row.sidecar or {}
    training = side.get("training") if isinstance(side.get("training"), dict) else {}
    trained_on = side.get("dataset") if isinstance(side.get("dataset"), dict) else {}
    return {
        "test_accuracy": _metric(side, "test", "accuracy"),
        "train_accuracy": _metric(side, "train", "accuracy"),
        "test_loss": _metric(side, "test", "loss"),
        "free_parameters": side.get("free_parameters"),
        "effective_width": side.get("effective_width"),
        "family": side.get("family"),
        "seed": side.get("seed"),
        "training": training,
        "trained_on": trained_on,
        "options": _options(row),
    }


def _comparisons(s: Session, **where: Any) -> tuple[list[dict[str, Any]], int]:
    """The newest 50 comparisons of a model or over a dataset (``where``), and how many in all."""
    items, total = repository.list_comparisons(s, limit=50, offset=0, **where)
    return [comparison_view(c) for c in items], total


@router.get("/models")
def models_page(
    request: Request, auth: Auth, q: str | None = None, page: str | None = None
) -> Response:
    query = as_text(q)
    rows, pager = paged(request, page, "/models", {"q": query}, repository.list_models, q=query)
    return render(
        request,
        "models.html",
        auth,
        title="Models",
        rows=[(r, model_facts(r)) for r in rows],
        q=query or "",
        pager=pager,
    )


@router.get("/models/{model_id}")
def model_page(request: Request, auth: Auth, model_id: int) -> Response:
    with services_of(request).db.session(readonly=True) as s:
        row = found(s, Model, model_id, auth)
        comparisons, total = _comparisons(s, model_id=model_id)
        datasets = {d.id: d for d in repository.list_datasets(s, limit=500, offset=0)[0]}
    return render(
        request,
        "model.html",
        auth,
        title=row.name,
        model=row,
        facts=model_facts(row),
        comparisons=comparisons,
        comparisons_total=total,
        datasets=datasets,
    )


@router.get("/datasets")
def datasets_page(request: Request, auth: Auth, page: str | None = None) -> Response:
    rows, pager = paged(request, page, "/datasets", {}, repository.list_datasets)
    return render(
        request,
        "datasets.html",
        auth,
        title="Datasets",
        rows=rows,
        pager=pager,
    )


# The peeks of the datasets whose pages were shown last: their labels, not their images.
_PEEKS: LRUCache[str, DatasetPeek] = LRUCache(maxsize=8)
_PEEKS_LOCK = threading.Lock()


def _peek(request: Request, row: Dataset) -> DatasetPeek:
    """What the page shows of a dataset: its labels, and its images one by one on demand
    (:func:`analysis.data.peek.peek_dataset`); never the whole dataset decoded."""
    key = dataset_key(row)
    with _PEEKS_LOCK:
        found = _PEEKS.get(key)
    if found is None:
        services = services_of(request)
        if row.builtin:
            found = peek_dataset(str(row.spec), split=row.split)
        else:
            found = peek_dataset(services.store.path(str(row.file_sha256), str(row.file_suffix)))
        with _PEEKS_LOCK:
            _PEEKS[key] = found
    return found


def sample_indices(labels: np.ndarray | None, n: int, count: int = SAMPLES) -> list[int]:
    """The first image of each class in turn (so every class shows), else the first images."""
    if labels is None or len(labels) == 0:
        return list(range(min(n, count)))
    chosen: list[int] = []
    seen_per_class: dict[int, list[int]] = {}
    for i, y in enumerate(labels.tolist()):
        seen_per_class.setdefault(int(y), []).append(i)
    rounds = max(len(v) for v in seen_per_class.values())
    for r in range(rounds):
        for cls in sorted(seen_per_class):
            if r < len(seen_per_class[cls]):
                chosen.append(seen_per_class[cls][r])
                if len(chosen) == min(count, n):
                    return chosen
    return chosen


@router.get("/datasets/{dataset_id}")
def dataset_page(request: Request, auth: Auth, dataset_id: int) -> Response:
    with services_of(request).db.session(readonly=True) as s:
        row = found(s, Dataset, dataset_id, auth)
        comparisons, total = _comparisons(s, dataset_id=dataset_id)
    data = _peek(request, row)
    indices = sample_indices(data.labels, len(data))
    classes = list(data.classes) if data.classes is not None else None
    samples = []
    for i in indices:
        label = None
        if data.labels is not None:
            y = int(data.labels[i])
            label = classes[y] if classes is not None and 0 <= y < len(classes) else str(y)
        samples.append({"index": i, "label": label})
    return render(
        request,
        "dataset.html",
        auth,
        title=row.name,
        dataset=row,
        samples=samples,
        comparisons=comparisons,
        comparisons_total=total,
    )


@router.get("/datasets/{dataset_id}/samples/{index}.png")
def dataset_sample(request: Request, auth: Auth, dataset_id: int, index: int) -> Response:
    """One image of the dataset as PNG; immutable for a given dataset content hash."""
    with services_of(request).db.session(readonly=True) as s:
        row = lookup(s, Dataset, dataset_id)
    if row is None:
        return Response(status_code=404)
    if not 0 <= index < row.n:
        return Response(status_code=404)
    etag = '"' + hashlib.sha256(f"sample-v1:{row.sha256}:{index}".encode()).hexdigest()[:32] + '"'
    headers = {"ETag": etag, "Cache-Control": "private, max-age=86400"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    sample = _peek(request, row).sample(index)
    # an image folder shows its original files (shrunk), arrays their pixels (enlarged)
    png = thumbnail(sample) if isinstance(sample, Image.Image) else render_sample(sample)
    return Response(png, media_type="image/png", headers=headers)
