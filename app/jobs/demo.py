"""The demo behind ``make run``: the zoo's six trainings, then its atlas, as jobs.

``cka-atlas serve --demo`` queues one ``demo`` job (:func:`queue_demo`) and serves at once; a
second start finds that job and queues nothing. The job is re-entrant, like a study's
(:mod:`app.jobs.study`): each time a worker runs it, it looks for the zoo's models by their
training keys, queues the first missing one as a child ``training`` (a ``/v1/trainings``
request, one at a time, so the page can say "training k of 6" and every finished model is one
log line) and parks (:mod:`app.jobs.parking`) until that training ends. Once all six exist
it queues the atlas (a comparison, found instead when an identical one exists) and succeeds,
its ``detail`` naming the comparison.

The atlas is calibrated, so its first page shows every cell with its company: intervals, the
comparison's default null (p- and q-values) and both baselines (random init, seed ceiling).
Checkpoints already in the zoo folder (``cka-atlas demo`` trains them there) are registered
with their training keys when the demo is queued (and on each start until it has succeeded), so
they are not trained again. :mod:`models` (torch, timm) is imported by the functions that need
it, so a start that finds the demo finished serves without loading it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from analysis import Cancelled
from analysis.options import BASELINES
from app.errors import ProblemError
from app.jobs.control import JobControl
from app.jobs.parking import Parked, progress_plan
from app.jobs.queue import LostJob, enqueue, park
from app.jobs.requests import ComparisonIn, TrainingIn
from app.jobs.study import models_by_key
from app.jobs.submit import submit_comparison, submit_training, training_identity
from app.jobs.train import register_checkpoint
from app.store.datasets import register_builtin_datasets
from app.store.orm import Comparison, Dataset, Job, JobState, Training, utcnow
from app.store.services import Services

__all__ = [
    "DEMO_BATCH_SIZE",
    "DEMO_BOOTSTRAP",
    "DemoTraining",
    "atlas_request",
    "demo_status",
    "queue_demo",
    "run_demo",
]

log = logging.getLogger(__name__)

DEMO_BATCH_SIZE = 150
DEMO_BOOTSTRAP = 200


@dataclass(frozen=True)
class DemoTraining:
    """One model of the zoo as a training request, and its training key."""

    name: str
    request: TrainingIn
    key: str | None


def atlas_request(model_ids: list[int], dataset_id: int) -> ComparisonIn:
    """The demo's atlas: the zoo over the digits, with image intervals and both baselines."""
    named: list[int | str] = list(model_ids)
    return ComparisonIn(
        model_ids=named,
        dataset_id=dataset_id,
        batch_size=DEMO_BATCH_SIZE,
        interval="images",
        resamples=DEMO_BOOTSTRAP,  # unused by image intervals; hashes as bootstrap=200 did
        baselines=BASELINES,
    )


def demo_trainings(services: Services, ds: Dataset, epochs: int | None) -> list[DemoTraining]:
    """The zoo (:data:`models.training.ZOO`) as trainings on ``ds``: each preset's recipe, or
    ``epochs`` epochs where given (a quick demo)."""
    import models  # torch and timm: loaded by the first start that needs the zoo
    from models.training import ZOO

    out = []
    for name, arch, seed in ZOO:
        family = models.family_of(arch)
        recipe = models.recipe("timm" if family is None else family.name)
        request = TrainingIn(
            arch=arch, dataset_id=ds.id, epochs=epochs or recipe.epochs, seed=seed, name=name
        )
        out.append(DemoTraining(name, request, training_identity(services, ds, request, {})))
    return out


def queue_demo(
    services: Services, zoo_dir: str | Path | None = None, *, epochs: int | None = None
) -> tuple[int, bool]:
    """Find the demo job, or queue it; returns (job id, queued now).

    ``zoo_dir``: a folder of zoo checkpoints to register first (those of the recipe alone:
    ``epochs`` None). A demo that has succeeded is found at once: no checkpoint can serve it
    any more and its dataset is registered, so a later start loads neither the models nor the
    data (the server registers the built-in datasets as it starts). A demo that failed or was
    cancelled is queued again.
    """
    with services.db.session(readonly=True) as s:
        found = _latest(s)
        if found is not None and found.status == JobState.SUCCEEDED:
            return found.id, False
    digits = register_builtin_datasets(services)[0]
    if zoo_dir is not None and epochs is None:
        from models.checkpoint import weights_path

        for t in demo_trainings(services, digits, None):
            path = weights_path(Path(zoo_dir) / t.name)
            if path.is_file() and path.with_suffix(".json").is_file():
                try:
                    register_checkpoint(
                        services,
                        path,
                        path.with_suffix(".json"),
                        name=t.name,
                        source="zoo",
                        training_key=t.key,
                    )
                except Exception as exc:  # a damaged checkpoint is trained again instead
                    log.warning("demo: not using %s (%s)", path, exc)
    with services.db.session() as s:
        found = _latest(s)
        if found is not None and found.status not in (JobState.FAILED, JobState.CANCELLED):
            return found.id, False
        job = enqueue(s, "demo", detail={"dataset_id": digits.id, "epochs": epochs})
        job_id = job.id
    services.dispatch(job_id)
    return job_id, True


def _zoo_size() -> int:
    from models.training import ZOO  # what a demo queued by an older version did not record

    return len(ZOO)


def _latest(session: Session) -> Job | None:
    return session.scalar(select(Job).where(Job.kind == "demo").order_by(Job.id.desc()).limit(1))


def _children(services: Services, job_id: int) -> list[Job]:
    with services.db.session(readonly=True) as s:
        return list(s.scalars(select(Job).where(Job.parent_id == job_id).order_by(Job.id)))


def _check(children: list[Job]) -> None:
    """A failed training fails the demo, a cancelled one cancels it."""
    for child in children:
        if child.status == JobState.FAILED:
            raise ProblemError(
                500,
                child.error_code or "internal_error",
                f"the demo's training (job {child.id}) failed: {child.error}",
            )
        if child.status == JobState.CANCELLED:
            raise Cancelled(f"the demo's training (job {child.id}) was cancelled")


def run_demo(services: Services, job: Job, control: JobControl) -> None:
    """The ``demo`` job kind (see the module docstring)."""
    detail = dict(job.detail or {})
    with services.db.session(readonly=True) as s:
        ds = s.get(Dataset, int(detail["dataset_id"]))
    if ds is None:
        raise LostJob(f"job {job.id}: the digits dataset is gone")
    plan = demo_trainings(services, ds, detail.get("epochs"))
    children = _children(services, job.id)
    _check(children)
    found = models_by_key(services, [t.key for t in plan if t.key])
    done = [t for t in plan if t.key in found]
    n = len(plan)
    if children and children[-1].status == JobState.SUCCEEDED:
        last = done[-1].name if done else "?"
        log.info("demo: model %d of %d trained (%s)", len(done), n, last)
    missing = [t for t in plan if t.key not in found]
    if missing:
        if control.should_stop:
            raise Cancelled(f"the demo (job {job.id}) was stopped")
        if not any(c.status.live for c in children):  # else: a restart, its training runs
            submit_training(services, missing[0].request, parent_id=job.id, dispatch=False)
        plan_detail = {**detail, **progress_plan(n + 1, len(done)), "trained": len(done), "of": n}
        plan_detail["left"] = [t.request.arch for t in missing]  # for the page's estimate
        if not park(services.db, job.id, control.worker_id, detail=plan_detail):
            raise LostJob(f"job {job.id} is no longer owned by {control.worker_id}")
        for child in _children(services, job.id):
            if child.status == JobState.QUEUED:
                services.dispatch(child.id)
        raise Parked(f"the demo waits for training {len(done) + 1} of {n} ({missing[0].name})")
    ids = [found[t.key].id for t in plan if t.key]
    comparison_id, created = submit_comparison(services, atlas_request(ids, ds.id))
    log.info(
        "demo: all %d models trained; atlas %s: /comparisons/%s",
        n,
        "queued" if created else "found",
        comparison_id,
    )
    result = {**detail, "trained": n, "of": n, "comparison_id": comparison_id}

    def write(s: Session) -> None:
        row = s.get(Job, job.id)
        if row is not None:
            row.detail = result

    control.commit(write)


def seconds_left(
    finished: list[tuple[str, float]],
    running: tuple[str, float, float] | None,
    left: list[str],
) -> float | None:
    """Seconds until the trainings ``left`` (architectures, in order; the first is the running
    one, if any) have all run, from what the finished ones took (``(arch, seconds)``) and the
    running one's pace (``(arch, elapsed, progress)``).

    The presets' trainings take several-fold different times, so each one not started is
    reckoned at the pace of its architecture where one of it has run, else at the slowest
    pace known (finished, or the running one's projected whole): never at the mean of cheaper
    ones, which made "about 1 min left" of two. The running one takes the rest at its own
    pace. None before any pace is known.
    """
    paces: dict[str, float] = {}
    for arch, seconds in finished:
        paces[arch] = max(paces.get(arch, 0.0), seconds)
    rest = 0.0
    if running is not None:
        arch, elapsed, progress = running
        if progress > 0:
            whole = elapsed / progress
            paces.setdefault(arch, whole)
            rest = whole - elapsed
        elif arch in paces:
            rest = max(paces[arch] - elapsed, 0.0)
        else:
            return None
        left = left[1:]
    if not paces:
        return None
    slowest = max(paces.values())
    return rest + sum(paces.get(arch, slowest) for arch in left)


def _elapsed(since: datetime) -> float:
    start = since if since.tzinfo else since.replace(tzinfo=utcnow().tzinfo)
    return max((utcnow() - start).total_seconds(), 0.0)


def demo_status(session: Session) -> dict[str, Any] | None:
    """What the home page says of the demo while it is not done: ``text`` ("demo: training k
    of 6, about N min of training left", then the atlas's progress) and ``href``; None once
    its atlas has succeeded (or there is no demo)."""
    job = _latest(session)
    if job is None:
        return None
    detail = job.detail or {}
    comparison_id = detail.get("comparison_id")
    if isinstance(comparison_id, int):
        cmp = session.get(Comparison, comparison_id)
        cmp_job = session.get(Job, cmp.job_id) if cmp is not None else None
        if cmp_job is None or not cmp_job.status.live:
            return None
        percent = round(100 * float(cmp_job.progress or 0.0))
        return {
            "text": f"demo: all models trained; the atlas is {percent} % done",
            "href": f"/comparisons/{comparison_id}",
        }
    if not job.status.live:
        return {"text": f"demo: {job.status} ({job.error or 'see the Jobs page'})", "href": "/jobs"}
    children = list(session.scalars(select(Job).where(Job.parent_id == job.id).order_by(Job.id)))
    query = select(Training.job_id, Training.arch)
    archs = {
        job_id: arch
        for job_id, arch in session.execute(
            query.where(Training.job_id.in_([c.id for c in children]))
        )
    }
    n = int(detail.get("of") or _zoo_size())
    done = int(detail.get("trained") or 0)
    finished = [
        (archs.get(c.id, ""), (c.finished_at - c.started_at).total_seconds())
        for c in children
        if c.status == JobState.SUCCEEDED and c.started_at and c.finished_at
    ]
    current = next((c for c in children if c.status == JobState.RUNNING), None)
    running = None
    if current is not None and current.started_at:
        running = (archs.get(current.id, ""), _elapsed(current.started_at), current.progress)
    text = f"demo: training {min(done + 1, n)} of {n}"
    seconds = seconds_left(finished, running, list(detail.get("left") or []))
    if seconds is not None:
        text += f", about {max(1, math.ceil(seconds / 60))} min of training left"
    return {"text": text + "; then the atlas fills in", "href": "/jobs"}
