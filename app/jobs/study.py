"""The study job: every training a job of its own, then one atlas, then the summary.

A study's job is re-entrant: every time a worker runs it, it looks at what its children have
done and takes the next step, then parks (:mod:`app.jobs.parking`) until they have done it:

1. ``trainings``: a training whose key (arch, options, seed, dataset, recipe) already has a
   model is reused; every other one becomes a child job of kind ``training``
   (:func:`run_study_training`), queued longest first, which any free worker runs (the
   embedded pool's threads or the Celery workers, one training per worker at a time). Each
   also stores its model's Grams for the atlas (:mod:`app.jobs.study_grams`), so that part
   of the atlas is shared by the workers too. The study parks while they run.
2. ``comparison``: once they have all succeeded, the atlas over every model of the study is
   found (by its request hash) or queued as a child job — sharded when ``CKA_SHARD_BATCHES``
   says so — and the study parks again, its atlas's id in its ``detail``. An identification
   study has more comparisons (``plan.atlases``: one per RBF bandwidth), found or queued
   together; the study's ``comparison_id`` is the main one, summary.json lists them all.
3. ``summary``: :func:`analysis.studies.summarize` writes summary.json (with ``devices``:
   where the trainings ran, from their checkpoints' sidecars), results.csv and the plots to
   the artifact store; ``done``.

Each training runs on the device of the worker that takes it (``CKA_DEVICE``).

Progress is the trainings done (reused ones included) out of n + 1, the atlas being the last
part. A cancel reaches every training and the atlas (:func:`app.jobs.cancel.stop`): each
stops at its next training step or batch — except an atlas that another requester asked for
too, which the study only stops holding (the study is one of its requesters, ``study:ID``, and
the study's view names it from the moment it is found). A worker killed mid-training has that
training re-queued by the stale reaper and run by another; a failed training fails the study.
A killed or re-submitted study finds every finished training by its key.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

import analysis
from analysis import Cancelled, studies
from app.errors import ProblemError
from app.jobs.cancel import study_requester
from app.jobs.control import JobControl
from app.jobs.parking import WAITS_FOR, Parked, progress_plan
from app.jobs.queue import LostJob, enqueue, park
from app.jobs.studies import comparison_body
from app.jobs.study_grams import store_atlas_grams
from app.jobs.submit import submit_comparison
from app.jobs.train import train, train_and_register
from app.store import repository
from app.store.orm import Comparison, Job, JobState, Model, Study, StudyMember
from app.store.services import Services

__all__ = ["models_by_key", "run_study", "run_study_training"]

log = logging.getLogger(__name__)


def _study_for_job(services: Services, job_id: int) -> Study:
    with services.db.session(readonly=True) as s:
        study = repository.study_for_job(s, job_id)
    if study is None:
        raise LostJob(f"job {job_id} has no study any more")
    return study


def _set_stage(services: Services, study_id: int, stage: str) -> None:
    with services.db.session() as s:
        s.execute(update(Study).where(Study.id == study_id).values(stage=stage))


def models_by_key(services: Services, keys: list[str]) -> dict[str, Model]:
    """The model of each training key that has one (the oldest, if several), in one query."""
    found: dict[str, Model] = {}
    with services.db.session(readonly=True) as s:
        stmt = select(Model).where(Model.training_key.in_(sorted(set(keys)))).order_by(Model.id)
        for model in s.scalars(stmt):
            found.setdefault(str(model.training_key), model)
    return found


def _record_member(session: Session, study_id: int, key: str, model_id: int, reused: bool) -> None:
    session.execute(
        update(StudyMember)
        .where(StudyMember.study_id == study_id, StudyMember.training_key == key)
        .values(model_id=model_id, reused=reused)
    )


def _children(services: Services, job_id: int) -> list[Job]:
    with services.db.session(readonly=True) as s:
        return list(s.scalars(select(Job).where(Job.parent_id == job_id).order_by(Job.id)))


def _check(children: list[Job], n: int) -> None:
    """A failed child fails the study, a cancelled one cancels it."""
    for child in children:
        what = (
            f"training {int((child.detail or {}).get('position', 0)) + 1} of {n} "
            f"({(child.detail or {}).get('name')})"
            if child.kind == "training"
            else f"the study's {child.kind} (job {child.id})"
        )
        if child.status == JobState.FAILED:
            raise ProblemError(
                500, child.error_code or "internal_error", f"{what} failed: {child.error}"
            )
        if child.status == JobState.CANCELLED:
            raise Cancelled(f"{what} was cancelled")


def _wait_for_children(
    services: Services, job: Job, control: JobControl, children: list[Job], plan: dict[str, Any]
) -> None:
    """Park the study until its live children end, and send the queued ones to the workers."""
    if not park(services.db, job.id, control.worker_id, detail=plan):
        raise LostJob(f"job {job.id} is no longer owned by {control.worker_id}")
    for child in children:
        if child.status == JobState.QUEUED:
            services.dispatch(child.id)
    live = sum(1 for c in children if c.status.live)
    raise Parked(f"job {job.id} waits for {live} of its children")


def _queue_trainings(
    services: Services, study: Study, job: Job, missing: list[tuple[int, studies.Training]], n: int
) -> None:
    with services.db.session() as s:
        for position, t in missing:
            enqueue(
                s,
                "training",
                parent_id=job.id,
                detail={
                    "study_id": study.id,
                    "key": t.key,
                    "name": t.name,
                    "position": position,
                    "of": n,
                    "arch": t.arch,
                    "dataset": t.dataset,
                    "kwargs": t.train_kwargs(),
                },
            )


def _work(t: studies.Training) -> float:
    """A training's rough cost, to queue the longest ones first: per layer the connections it
    computes (Ω, or Ω / p for a sparse layer, which runs as a dense masked one), times layers
    and epochs; 0 where Ω is not defined (a timm architecture).

    With W workers a study ends when its last training does; queued longest first (the
    longest-processing-time rule), the short ones fill in at the end and the workers finish
    together instead of one running a long training while the others stand idle. It is read
    from the plan (no model is built).
    """
    omega, density = t.structure.get("omega"), t.structure.get("density")
    if not omega:
        return 0.0
    dense = float(omega) / float(density or 1.0)
    return dense * int(t.config.get("num_blocks") or 1) * int(t.recipe.get("epochs") or 1)


def _trainings(
    services: Services, study: Study, job: Job, control: JobControl, plan: studies.StudyPlan
) -> dict[str, Model]:
    """Every training's model once all exist; else queue the missing ones and park."""
    n = len(plan.trainings)
    children = _children(services, job.id)
    _check(children, n)
    trained = [c for c in children if c.kind == "training"]
    by_key = models_by_key(services, [t.key for t in plan.trainings])
    found = {t.key: by_key.get(t.key) for t in plan.trainings}
    if not trained:  # the first run: reuse what exists, queue the rest
        with services.db.session() as s:
            for t in plan.trainings:
                model = found[t.key]
                if model is not None:
                    _record_member(s, study.id, t.key, model.id, reused=True)
        missing = [(k, t) for k, t in enumerate(plan.trainings) if found[t.key] is None]
        missing.sort(key=lambda item: -_work(item[1]))  # stable: a tie keeps the plan's order
        if missing:
            log.info("study %s: %d of %d trainings to run", study.id, len(missing), n)
            _queue_trainings(services, study, job, missing, n)
            children = _children(services, job.id)
            trained = children
    have = {key: m for key, m in found.items() if m is not None}
    if len(have) == n:
        return have
    # Reused trainings count as done; each training child adds its own progress.
    plan_detail = progress_plan(n + 1, n - len(trained))
    if not any(c.status.live for c in children):
        # Every child succeeded but a model is missing: it was deleted meanwhile.
        lost = next(t for t in plan.trainings if t.key not in have)
        raise analysis.AnalysisError(f"the model of training {lost.name!r} was deleted")
    _wait_for_children(services, job, control, children, plan_detail)
    raise AssertionError("unreachable")  # pragma: no cover - _wait_for_children raises


def _submit_atlases(
    services: Services, study: Study, job: Job, plan: studies.StudyPlan, trained: dict[str, Model]
) -> dict[str, int]:
    """Find or queue every comparison of the plan (``plan.atlases``) as the study's child."""
    model_ids = list(dict.fromkeys(trained[t.key].id for t in plan.trainings))
    ids = {}
    for name, options in plan.atlases.items():
        body = comparison_body(options, model_ids, study.dataset_id)
        ids[name], _ = submit_comparison(
            services, body, dispatch=False, parent_id=job.id, requester=study_requester(study)
        )
    return ids


def _adopt(
    services: Services, study: Study, job: Job, comparison_id: int, main: bool
) -> tuple[JobState, int | None, str | None, int]:
    """(status, parent job, error, job id) of an atlas's job, adopting it when it has no parent;
    the main atlas is recorded as the study's comparison."""
    with services.db.session() as s:
        # the comparison's job, not the comparison: its result is large and not needed here
        cmp_job = s.scalar(
            select(Job)
            .join(Comparison, Comparison.job_id == Job.id)
            .where(Comparison.id == comparison_id)
            .with_for_update(of=Job)
        )
        if cmp_job is None:
            raise analysis.AnalysisError(f"comparison {comparison_id} was deleted")
        if cmp_job.parent_id is None and cmp_job.status.live:
            # Adopted, to wake the study when it ends; the study holds it as one requester
            # (submit_comparison recorded it): cancelling the study withdraws only that.
            cmp_job.parent_id = job.id
        if main:
            s.execute(update(Study).where(Study.id == study.id).values(comparison_id=comparison_id))
        return cmp_job.status, cmp_job.parent_id, cmp_job.error, cmp_job.id


def _atlas(
    services: Services,
    study: Study,
    job: Job,
    control: JobControl,
    plan: studies.StudyPlan,
    trained: dict[str, Model],
) -> dict[str, int]:
    """The ids of the study's succeeded comparisons by name (``main``: the atlas; an
    identification study has one per RBF bandwidth too); else find or queue them as children,
    and park.

    Their ids are kept in the parked job's ``detail`` (``atlases``), so the run after it reads
    their state instead of submitting (and validating) the requests again.
    """
    n = len(plan.trainings)
    ids = (job.detail or {}).get("atlases")
    if not isinstance(ids, dict) or set(ids) != set(plan.atlases):
        ids = _submit_atlases(services, study, job, plan, trained)
    states = {name: _adopt(services, study, job, i, name == "main") for name, i in ids.items()}
    for name, (status, _owner, error, _job_id) in states.items():
        if not status.live and status != JobState.SUCCEEDED:
            raise analysis.AnalysisError(
                f"the study's comparison {ids[name]} {status}: {error or 'no reason given'}"
            )
    live = {name: state for name, state in states.items() if state[0].live}
    if not live:
        return ids
    children = _children(services, job.id)
    trainings = sum(1 for c in children if c.kind == "training")
    # An atlas another job owns (two identical studies at once) is waited for parked, as a
    # child is: holding a worker to poll it would keep the only worker from running it.
    others = sorted(state[3] for state in live.values() if state[1] != job.id)
    plan_detail = {**progress_plan(n + 1, n - trainings), "atlases": ids, WAITS_FOR: others}
    mine = {state[3] for state in live.values() if state[1] == job.id}
    waiting = [c for c in children if c.id in mine]
    _wait_for_children(services, job, control, waiting, plan_detail)
    raise AssertionError("unreachable")  # pragma: no cover - _wait_for_children raises


def _accuracy(model: Model) -> float | None:
    metrics = (model.sidecar or {}).get("metrics") or {}
    test = metrics.get("test") if isinstance(metrics, dict) else None
    value = test.get("accuracy") if isinstance(test, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _load_atlas(services: Services, comparison_id: int) -> tuple[Any, dict[int, str]]:
    """The comparison's atlas (an AtlasLike for summarize) and its model labels by model id."""
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        assert cmp is not None and cmp.result is not None
        labels = {m.model_id: m.label for m in cmp.members}
        return analysis.Atlas.from_dict(cmp.result), labels


def _summarize(
    services: Services,
    plan: studies.StudyPlan,
    trained: dict[str, Model],
    comparison_ids: dict[str, int],
) -> tuple[dict[str, Any], dict[str, str]]:
    """summary.json (with each entry's model ids) and the stored artifacts' sha256s."""
    atlas, labels = _load_atlas(services, comparison_ids["main"])
    extra = {}
    for name, cid in comparison_ids.items():
        if name != "main":
            other, other_labels = _load_atlas(services, cid)
            if other_labels != labels:  # the same request but for its options: same labels
                raise analysis.AnalysisError(f"comparison {cid} labels the models otherwise")
            extra[name] = other
    finished = [
        {
            "key": key,
            "name": labels[model.id],
            "accuracy": _accuracy(model),
            "training": (model.sidecar or {}).get("training"),
        }
        for key, model in trained.items()
    ]
    result = studies.summarize(plan, finished, atlas, extra)
    summary = dict(result.summary)
    ids = {
        e.name: [trained[e.keys[seed]].id for seed in sorted(e.keys)] for e in plan.all_entries()
    }
    summary["reference"] = {**summary["reference"], "model_ids": ids[plan.reference.name]}
    summary["arms"] = [{**arm, "model_ids": ids[arm["name"]]} for arm in summary["arms"]]
    summary["comparison_id"] = comparison_ids["main"]
    if len(comparison_ids) > 1:
        summary["comparison_ids"] = dict(comparison_ids)
    with services.store.writing():
        artifacts = {
            "csv": services.store.put_bytes(result.csv().encode(), ".csv"),
            "png": services.store.put_bytes(result.plots["png"], ".png"),
            "svg": services.store.put_bytes(result.plots["svg"], ".svg"),
        }
    return summary, artifacts


def run_study(services: Services, job: Job, control: JobControl) -> None:
    """The ``study`` job kind (see the module docstring)."""
    study = _study_for_job(services, job.id)
    plan = studies.plan(study.spec, quick=bool(study.params.get("quick")))
    if study.stage in ("queued", "trainings"):
        _set_stage(services, study.id, "trainings")
    trained = {t.key: m for t, m in _ordered(plan, _trainings(services, study, job, control, plan))}
    _set_stage(services, study.id, "comparison")
    comparison_ids = _atlas(services, study, job, control, plan, trained)
    comparison_id = comparison_ids["main"]
    if control.should_stop or control.shutdown.is_set():
        raise Cancelled(f"study {study.id} was stopped")
    _set_stage(services, study.id, "summary")
    summary, artifacts = _summarize(services, plan, trained, comparison_ids)

    def write(s: Session) -> None:
        row = s.get(Study, study.id)
        if row is None:
            raise LostJob(f"study {study.id} was deleted while running")
        row.summary = summary
        row.artifacts = artifacts
        row.comparison_id = comparison_id
        row.stage = "done"

    control.commit(write)


def _ordered(
    plan: studies.StudyPlan, by_key: dict[str, Model]
) -> list[tuple[studies.Training, Model]]:
    return [(t, by_key[t.key]) for t in plan.trainings]


def run_study_training(services: Services, job: Job, control: JobControl) -> None:
    """A study's ``training`` child: train (or find by key) one model and record it.

    The training takes the job's cancel callback, so a cancelled or shut-down study stops
    within one training step. Then the model's Grams for the study's atlas are stored
    (:mod:`app.jobs.study_grams`), so the atlas runs no model. The job's ``detail`` gets the
    worker, host, seconds (all, and of the training alone) and what the Gram pass did.
    """
    d = dict(job.detail or {})
    if job.parent_id is None or "key" not in d:
        raise LostJob(f"job {job.id} is not a training of a study")
    began = time.perf_counter()
    model = models_by_key(services, [d["key"]]).get(d["key"])
    if model is None:
        model = train_and_register(
            services,
            control,
            train,  # looked up here, so a test's stand-in for this module's train is used
            f"training {d['name']!r}",
            d["arch"],
            analysis.training_data(d["dataset"]),
            name="model",
            register={"name": d["name"], "source": "study", "training_key": d["key"]},
            **d["kwargs"],
        )
    trained_s = time.perf_counter() - began
    grams = store_atlas_grams(services, int(d["study_id"]), model.id, control)
    detail = {
        **d,
        "worker": control.worker_id,
        "host": socket.gethostname(),
        "seconds": round(time.perf_counter() - began, 3),
        "training_seconds": round(trained_s, 3),
        "grams": grams,
        "attempts": job.attempts,
        "model_id": model.id,
    }
    model_id = model.id

    def write(s: Session) -> None:
        row = s.get(Job, job.id)
        if row is not None:
            row.detail = detail
        _record_member(s, int(d["study_id"]), d["key"], model_id, reused=False)

    control.commit(write)
