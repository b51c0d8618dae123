"""What a comparison job reads: its member checkpoints, its dataset and its engine options.

Shared by the comparison handler (:mod:`app.jobs.compare`) and its shards
(:mod:`app.jobs.shards`), so a shard runs exactly the comparison its parent would have.
"""

from __future__ import annotations

from typing import Any

import analysis
from app.jobs.queue import LostJob
from app.store import repository
from app.store.orm import Comparison, Dataset, Model
from app.store.services import Services

__all__ = ["engine_options", "load_comparison", "member_rows"]


def load_comparison(services: Services, job_id: int) -> tuple[Comparison, Dataset]:
    """The comparison that job ``job_id`` computes, and its dataset."""
    with services.db.session(readonly=True) as s:
        cmp = repository.comparison_for_job(s, job_id)
        ds = s.get(Dataset, cmp.dataset_id) if cmp else None
    if cmp is None or ds is None:
        raise LostJob(f"job {job_id} has no comparison any more")
    return cmp, ds


def member_rows(services: Services, cmp: Comparison) -> dict[str, Model]:
    """Label -> model row of every member; fails when one was deleted before the job ran."""
    with services.db.session(readonly=True) as s:
        members = [(m.label, s.get(Model, m.model_id)) for m in cmp.members]
    missing = [label for label, row in members if row is None]
    if missing:
        raise analysis.AnalysisError(f"models {missing} were deleted before the job ran")
    return {label: row for label, row in members if row is not None}


def engine_options(params: dict[str, Any], device: str) -> dict[str, Any]:
    """The keyword options of :func:`analysis.compare` that the stored ``params`` ask for.

    Permutations and sensitivity are passed only when asked for (older params lack them, and
    lack a null unless they have permutations).
    """
    options: dict[str, Any] = {
        "kernel": params["kernel"],
        "estimator": params["estimator"],
        "mode": params["mode"],
        "batch_size": params["batch_size"],
        "feature": params["feature"],
        "device": device,
        "progress": False,
    }
    if params.get("permutations"):
        options["permutations"] = params["permutations"]  # the permutation null
    else:  # params stored before the null option had none
        options["null"] = params.get("null", "none")
    if params.get("sensitivity"):
        options["sensitivity"] = True
    return options
