"""What a comparison job reads: its members, its dataset, its options and its plan.

Shared by the comparison handler (:mod:`app.jobs.compare`) and its shards
(:mod:`app.jobs.shards`), so a shard runs exactly the comparison its parent planned. The plan is
the library's (:func:`analysis.plan_comparison`); what the store adds is :class:`StoreNetworks`:
the members' and the seed ceiling's networks are checkpoints of the store, leased from the
process's LRU, their sibling candidates every checkpoint of a member's architecture.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from torch import nn

import analysis
from app.jobs.queue import LostJob
from app.jobs.requests import MAX_SHARDS
from app.store import repository
from app.store.orm import Comparison, Dataset, Model
from app.store.services import Services

__all__ = [
    "StoreNetworks",
    "comparison_plan",
    "load_comparison",
    "member_rows",
    "stored_options",
]


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


def _identity(row: Model) -> analysis.Identity:
    return analysis.Identity.of(row.sha256, row.name, row.arch, row.config, row.sidecar, row.id)


class StoreNetworks:
    """The store's checkpoints as a comparison's networks (:class:`analysis.Networks`)."""

    where = "in the store"

    def __init__(self, services: Services) -> None:
        self.services = services

    def candidates(self, archs: Collection[str]) -> Sequence[analysis.Identity]:
        """Every checkpoint of one of ``archs``, lowest id first."""
        with self.services.db.session(readonly=True) as s:
            stmt = select(Model).where(Model.arch.in_(list(archs))).order_by(Model.id)
            return [_identity(r) for r in s.scalars(stmt).all()]

    def lease(self, keys: Sequence[str]) -> AbstractContextManager[dict[str, nn.Module]]:
        return self.services.models.lease(list(keys))


def comparison_plan(
    services: Services, cmp: Comparison, data: Any
) -> tuple[analysis.ComparisonPlan, dict[str, Model]]:
    """The plan of comparison ``cmp`` over its loaded ``data`` (the seed ceiling's siblings
    taken among every checkpoint in the store), and its members' rows."""
    params = cmp.params
    rows = member_rows(services, cmp)
    opts = stored_options(params)
    members = [
        analysis.Member(
            label=label,
            layers=tuple(params["resolved_layers"][label]),
            key=row.sha256,
            cache_key=row.sha256,
            identity=_identity(row),
        )
        for label, row in rows.items()
    ]
    plan = analysis.plan_comparison(
        members,
        opts,
        batches=analysis.batch_count(data, opts.batch_size),
        networks=StoreNetworks(services),
        shards=int(params.get("shards") or 1),
        shard_batches=services.settings.shard_batches or None,
        max_shards=MAX_SHARDS,
    )
    return plan, rows
