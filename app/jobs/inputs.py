"""What a comparison job reads: its member checkpoints, its dataset and its options.

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

__all__ = ["load_comparison", "member_rows", "stored_options"]


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


def stored_options(params: dict[str, Any]) -> analysis.CompareOptions:
    """The :class:`analysis.CompareOptions` that stored ``params`` ask for, the layers as
    resolved per member; params of every release are read (see :mod:`app.jobs.submit`)."""
    values = {
        k: params[k] for k in analysis.CompareOptions.model_fields if params.get(k) is not None
    }
    values["layers"] = params["resolved_layers"]
    if "interval" not in params:  # before interval and resamples: one count said both
        values["bootstrap"] = int(params.get("bootstrap") or 0)
    if "null" not in params:  # before the null option: the permutation null, or none
        values["null"] = "permutation" if params.get("permutations") else "none"
    return analysis.CompareOptions.build(**values)
