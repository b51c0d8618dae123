"""A study's training stores its model's Grams for the study's atlas, while trainings still run.

Most of a study's atlas is running every model over the study's dataset and forming its
per-batch Grams, and that depends on one model alone. So the training job that made a model,
on whichever worker ran it, runs that model once over the atlas's batches with the atlas's
options (:func:`analysis.compare` without baselines on the one-model comparison
:func:`app.jobs.studies.atlas_body` gives): its Grams, the analytic null's numbers and its
block with itself go to the store's Gram cache under the keys the atlas asks for, since a key
is made of the model, the dataset, the batch plan and the options, never of the other models
(:mod:`analysis.engine.gram_cache`). The atlas then runs no model: it reads them and forms the
blocks between models, the same numbers bit for bit. With W workers this part of the atlas is
divided by W instead of running on the one worker that runs the atlas.

Best effort: when the one-model comparison is refused (its options or size), or its worker is
stopping, the training still succeeds and the atlas computes what is missing (or refuses the
same way). A cancel, a lost job or the job's time limit stops it, and the training with it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import analysis
from app.errors import ProblemError
from app.jobs.control import JobControl
from app.jobs.inputs import stored_options
from app.jobs.studies import atlas_body
from app.jobs.submit import validate_comparison
from app.store.artifacts import StoreGramCache
from app.store.datasets import dataset_key
from app.store.orm import Study
from app.store.services import Services

__all__ = ["store_atlas_grams"]

log = logging.getLogger(__name__)


def store_atlas_grams(
    services: Services, study_id: int, model_id: int, control: JobControl
) -> dict[str, Any]:
    """Run model ``model_id`` as the study's atlas will, storing its Grams; what it did
    (seconds, and the Gram cache's hits and misses, or why it did nothing)."""
    began = time.perf_counter()
    with services.db.session(readonly=True) as s:
        study = s.get(Study, study_id)
    if study is None:
        return {"skipped": "the study was deleted"}
    try:
        rows, ds, params = validate_comparison(services, atlas_body(study, [model_id]))
    except ProblemError as exc:  # the atlas itself will say it (or compute what it can)
        log.info("study %s: model %s has no stored Grams: %s", study_id, model_id, exc.detail)
        return {"skipped": exc.detail}
    if params["mode"] != "minibatch":
        return {"skipped": f"mode {params['mode']} keeps no Grams"}
    label, sha = params["labels"][0], rows[0].sha256
    data = services.datasets.get(dataset_key(ds))
    cache = StoreGramCache(services.store)

    def go_on(done: int, total: int) -> bool:  # stops as the training would; its progress stays
        return not (control.should_stop or control.shutdown.is_set())

    options = analysis.CompareOptions.build(stored_options(params), baselines=())
    try:
        with services.models.lease([sha]) as loaded:
            atlas = analysis.compare(
                {label: loaded[sha]},
                data,
                options,
                gram_cache=cache,
                model_keys={label: sha},
                on_batch=go_on,
                device=services.device,
            )
    except analysis.Cancelled:
        if control.should_stop:  # cancelled, lost or out of time: the training stops too
            raise
        return {"skipped": "its worker was stopping"}  # the model is trained: keep it
    stats = atlas.diagnostics.get("gram_cache") or {}
    return {
        "seconds": round(time.perf_counter() - began, 3),
        **{k: stats[k] for k in ("hits", "misses") if k in stats},
    }
