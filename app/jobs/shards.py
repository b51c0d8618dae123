"""Sharded comparisons: one comparison split by ranges of batches over several jobs.

The minibatch estimator sums per-batch HSIC terms, so a comparison splits exactly: shard k
runs every model over its range of batches (:func:`analysis.run_shard`, the plan's run step over
that range) and writes the
summed terms — the per-batch ones too when a bootstrap needs them, the permutation null's sums,
the spectra — to ``tmp/shards-<comparison>/<k>.safetensors`` in the shared store; the
comparison job combines them (:func:`analysis.combine`) into the atlas an unsharded run gives.

The life of a sharded comparison:

1. Its job is claimed like any other. Its plan (:func:`analysis.plan_comparison`, from
   :func:`app.jobs.inputs.comparison_plan`) has more than one range of batches (the request's
   ``shards``, or more than ``CKA_SHARD_BATCHES`` batches), so the plan's run step calls
   :func:`gather`, which adds one queued ``shard`` job per range (once; each records its range),
   parks the comparison job (:func:`app.jobs.queue.park`) and dispatches the shards. No worker
   waits for them.
2. Any free worker claims a shard (Celery: every worker on the queue; the embedded worker: the
   same pool, one after another), runs it, writes its file and, in the transaction that marks
   it succeeded, its detail: worker, host, batches, seconds, attempts.
3. The worker that ends the last shard takes the comparison job back
   (:func:`app.jobs.queue.take_over`: one winner) and runs its handler again, which now finds
   every shard ended: it combines them, or fails or cancels as they did.

A shard whose worker is killed is re-queued by the stale reaper like any job and run again
elsewhere; it rewrites the same file (atomically), so the comparison still gets one result.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

import analysis
from app.errors import ProblemError
from app.jobs.control import JobControl
from app.jobs.inputs import StoreNetworks, comparison_plan, load_comparison
from app.jobs.parking import Parked, progress_plan
from app.jobs.queue import LostJob, enqueue, park
from app.store import gc
from app.store.artifacts import StoreDecodedCache, StoreGramCache
from app.store.datasets import dataset_key
from app.store.orm import Job, JobState
from app.store.services import Services

__all__ = ["discard", "gather", "run_shard", "shard_dir"]


def shard_dir(services: Services, comparison_id: int) -> Path:
    """Where a comparison's shards put their terms (scratch space: GC removes it once old)."""
    return services.store.tmp / f"shards-{comparison_id}"


def _file(services: Services, comparison_id: int, index: int) -> Path:
    return shard_dir(services, comparison_id) / f"{index}.safetensors"


def gather(
    services: Services,
    job: Job,
    control: JobControl,
    comparison_id: int,
    plan: analysis.ComparisonPlan,
    share: float = 1.0,
) -> tuple[list[analysis.Partial], list[dict[str, Any]]] | None:
    """Every shard's terms and details once all have succeeded; else start them and park.

    None: the comparison has no shards and its plan asks for none, so it runs in one piece.
    Creates one shard job per range of ``plan.shards`` on the first call; later calls use the
    shards that exist, whatever the plan says now. ``share``: the part of the comparison's
    progress that its shards make (the rest, after them, its baselines and finish). Raises
    when a shard failed or was cancelled (the comparison ends the same way),
    :class:`app.jobs.parking.Parked` after parking.
    """
    with services.db.session() as s:
        children = list(s.scalars(select(Job).where(Job.parent_id == job.id)))
        ranges = plan.shards
        if not children and not ranges:
            return None
        if not children:
            for k, r in enumerate(ranges):
                shard = enqueue(s, "shard", parent_id=job.id, shard=k)
                shard.detail = {"batches": [r.start, r.stop], "of": len(ranges)}
            parent = s.get(Job, job.id)
            if parent is not None:  # the shards' progress fills ``share`` of the parent's
                parts = progress_plan(len(ranges) / share, 0.0)
                parent.detail = {**(parent.detail or {}), **parts}
            s.flush()
            children = list(s.scalars(select(Job).where(Job.parent_id == job.id)))
        found = sorted(
            (c.shard or 0, c.id, JobState(c.status), c.error, c.error_code, dict(c.detail or {}))
            for c in children
        )
    n = len(found)
    for k, _, state, error, code, _ in found:
        if state == JobState.FAILED:
            raise ProblemError(
                500, code or "internal_error", f"shard {k + 1} of {n} failed: {error}"
            )
    if any(state == JobState.CANCELLED for _, _, state, *_ in found):
        raise analysis.Cancelled("a shard of this comparison was cancelled")
    if all(state == JobState.SUCCEEDED for _, _, state, *_ in found):
        partials = [analysis.Partial.load(_file(services, comparison_id, k)) for k, *_ in found]
        return partials, [{"shard": k, **detail} for k, *_, detail in found]
    if not park(services.db, job.id, control.worker_id):
        raise LostJob(f"job {job.id} is no longer owned by {control.worker_id}")
    for _, job_id, state, *_ in found:
        if state == JobState.QUEUED:
            services.dispatch(job_id)
    raise Parked(f"job {job.id} waits for its {n} shards")


def run_shard(services: Services, job: Job, control: JobControl) -> None:
    """Run every model of the parent comparison over this shard's batches; store the terms."""
    if job.parent_id is None or job.shard is None or not job.detail:
        raise LostJob(f"job {job.id} is not a shard of a comparison")
    start, stop = job.detail["batches"]
    cmp, ds = load_comparison(services, job.parent_id)
    data = services.datasets.get(dataset_key(ds))
    cache = StoreGramCache(services.store)
    began = time.perf_counter()
    with gc.refs_kept(services.db, services.store, cmp.id, cache.touched):
        plan, _ = comparison_plan(services, cmp, data)
        hooks = analysis.Hooks(
            StoreNetworks(services),
            device=services.device,
            gram_cache=cache,
            decoded_cache=StoreDecodedCache(services.store, cache.touched),
            on_batch=control.on_batch,
        )
        part = analysis.run_shard(plan, data, hooks, range(start, stop))
    path = _file(services, cmp.id, job.shard)
    with services.store.writing():
        path.parent.mkdir(parents=True, exist_ok=True)
        part.save(path)
    detail = {
        **job.detail,
        "worker": control.worker_id,
        "host": socket.gethostname(),
        "seconds": round(time.perf_counter() - began, 3),
        "attempts": job.attempts,
        "n": part.counters["n"],
    }

    def write(s: Any) -> None:
        row = s.get(Job, job.id)
        if row is not None:
            row.detail = detail
        gc.record_refs(s, services.store, cmp.id, cache.touched, "gram")

    control.commit(write)


def discard(services: Services, comparison_id: int) -> None:
    """Remove a combined comparison's shard files (GC would, later)."""
    shutil.rmtree(shard_dir(services, comparison_id), ignore_errors=True)
