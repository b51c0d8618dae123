"""The study job: train (or reuse) every model of a study, compare them once, summarise.

Stages, recorded on the study row: ``trainings`` (k of n, one :func:`models.training.train`
per training in this process, a finished model with the same training key reused instead),
``comparison`` (one atlas over every model of the study, a comparison job of its own found or
queued through :func:`app.jobs.submit.submit_comparison` and run here unless another worker
already has it), ``summary`` (:func:`analysis.studies.summarize`: summary.json, results.csv
and the plots, stored in the artifact store), ``done``.

Cancellation and worker shutdown are checked between trainings and while the comparison
runs. A killed job is re-queued by the stale-job reaper and starts over: every training that
finished is found again by its key, and the comparison by its request hash, so a resumed
study redoes only what was not finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

import analysis
from analysis import Cancelled, studies
from app.jobs.control import JobControl
from app.jobs.queue import LostJob, claim, request_cancel
from app.jobs.reaper import requeue_stale
from app.jobs.studies import comparison_body
from app.jobs.submit import submit_comparison
from app.jobs.train import register_checkpoint
from app.store import repository
from app.store.orm import Comparison, Job, JobState, Model, Study, StudyMember
from app.store.services import Services
from models.training import train

__all__ = ["RunClaimed", "run_study"]

log = logging.getLogger(__name__)

# app.jobs.run.run_claimed, passed in by the dispatcher (which imports this module).
RunClaimed = Callable[[Services, Job, str, threading.Event | None], None]
POLL_S = 0.2


def _study_for_job(services: Services, job_id: int) -> Study:
    with services.db.session(readonly=True) as s:
        study = repository.study_for_job(s, job_id)
    if study is None:
        raise LostJob(f"job {job_id} has no study any more")
    return study


def _set_stage(services: Services, study_id: int, stage: str) -> None:
    with services.db.session() as s:
        s.execute(update(Study).where(Study.id == study_id).values(stage=stage))


def _stop_if_asked(control: JobControl, what: str) -> None:
    if control.lost:
        raise LostJob(f"job {control.job_id} is no longer this worker's")
    if control.cancel_requested or control.shutdown.is_set():
        raise Cancelled(f"{what} was stopped")


def _model_by_key(services: Services, key: str) -> Model | None:
    with services.db.session(readonly=True) as s:
        return s.scalar(select(Model).where(Model.training_key == key).order_by(Model.id).limit(1))


def _train(services: Services, t: studies.Training) -> Model:
    with services.store.scratch() as tmp:
        with services.store.writing():  # a full or read-only store fails with a sentence
            path = Path(
                train(
                    t.arch,
                    t.dataset,
                    out_dir=Path(tmp),
                    name="model",
                    progress=False,
                    **t.train_kwargs(),
                )
            )
        model, _ = register_checkpoint(
            services,
            path,
            path.with_suffix(".json"),
            name=t.name,
            source="study",
            training_key=t.key,
        )
    return model


def _record_member(
    services: Services, study_id: int, key: str, model_id: int, reused: bool
) -> None:
    with services.db.session() as s:
        s.execute(
            update(StudyMember)
            .where(StudyMember.study_id == study_id, StudyMember.training_key == key)
            .values(model_id=model_id, reused=reused)
        )


def _trainings(
    services: Services, study: Study, plan: studies.StudyPlan, control: JobControl
) -> dict[str, Model]:
    """Every training's model, reused by key or trained now; progress k / (n + 1)."""
    n = len(plan.trainings)
    out: dict[str, Model] = {}
    for k, t in enumerate(plan.trainings):
        _stop_if_asked(control, f"study {study.id}")
        control.progress = k / (n + 1)
        model = _model_by_key(services, t.key)
        reused = model is not None
        if model is None:
            log.info("study %s: training %d of %d (%s)", study.id, k + 1, n, t.name)
            model = _train(services, t)
        _record_member(services, study.id, t.key, model.id, reused)
        out[t.key] = model
    control.progress = n / (n + 1)
    return out


def _comparison_state(services: Services, comparison_id: int) -> tuple[str, float, str, int]:
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        if cmp is None:
            raise analysis.AnalysisError(f"comparison {comparison_id} was deleted")
        job = cmp.job
        return job.status, float(job.progress), job.error or "", job.id


def _compare(
    services: Services,
    study: Study,
    plan: studies.StudyPlan,
    model_ids: list[int],
    control: JobControl,
    run_claimed: RunClaimed,
) -> int:
    """Find or queue the atlas of the study's models and see it finished; its id."""
    body = comparison_body(plan.cka, model_ids, study.dataset_id)
    comparison_id, _ = submit_comparison(services, body, dispatch=False)
    n = len(plan.trainings)
    worker = f"{control.worker_id}/comparison"
    stop = threading.Event()
    runner: threading.Thread | None = None
    settings = services.settings
    next_reap = 0.0
    try:
        while True:
            if runner is None and time.monotonic() >= next_reap:
                # Another process may have died running this comparison (a killed CLI run has
                # no reaper of its own): put it back in the queue once its heartbeat is stale.
                requeue_stale(services.db, settings.stale_after_s, settings.max_attempts)
                next_reap = time.monotonic() + max(settings.stale_after_s / 4, 0.5)
            status, progress, error, job_id = _comparison_state(services, comparison_id)
            control.progress = (n + progress) / (n + 1)
            if status == JobState.SUCCEEDED:
                return comparison_id
            if status in (JobState.FAILED, JobState.CANCELLED):
                raise analysis.AnalysisError(
                    f"the study's comparison {comparison_id} {status}: {error or 'no reason given'}"
                )
            if control.cancel_requested and runner is not None:
                with services.db.session() as s:
                    request_cancel(s, job_id)
            _stop_if_asked(control, f"study {study.id}")
            if status == JobState.QUEUED and (runner is None or not runner.is_alive()):
                claimed = claim(services.db, worker, job_id)
                if claimed is not None:  # else another worker has it: wait for it
                    runner = threading.Thread(
                        target=run_claimed,
                        args=(services, claimed, worker, stop),
                        name=f"study-{study.id}-comparison",
                        daemon=True,
                    )
                    runner.start()
            control.shutdown.wait(POLL_S)
    finally:
        if runner is not None and runner.is_alive():
            stop.set()  # the comparison stops at its next batch (released or cancelled)
            runner.join()


def _accuracy(model: Model) -> float | None:
    metrics = (model.sidecar or {}).get("metrics") or {}
    test = metrics.get("test") if isinstance(metrics, dict) else None
    value = test.get("accuracy") if isinstance(test, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _summarize(
    services: Services, plan: studies.StudyPlan, trained: dict[str, Model], comparison_id: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """summary.json (with each entry's model ids) and the stored artifacts' sha256s."""
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        assert cmp is not None and cmp.result is not None
        labels = {m.model_id: m.label for m in cmp.members}
        atlas: Any = analysis.Atlas.from_dict(cmp.result)  # an AtlasLike for summarize
    finished = [
        {"key": key, "name": labels[model.id], "accuracy": _accuracy(model)}
        for key, model in trained.items()
    ]
    result = studies.summarize(plan, finished, atlas)
    summary = dict(result.summary)
    ids = {
        e.name: [trained[e.keys[seed]].id for seed in sorted(e.keys)] for e in plan.all_entries()
    }
    summary["reference"] = {**summary["reference"], "model_ids": ids[plan.reference.name]}
    summary["arms"] = [{**arm, "model_ids": ids[arm["name"]]} for arm in summary["arms"]]
    summary["comparison_id"] = comparison_id
    with services.store.writing():
        artifacts = {
            "csv": services.store.put_bytes(result.csv().encode(), ".csv"),
            "png": services.store.put_bytes(result.plots["png"], ".png"),
            "svg": services.store.put_bytes(result.plots["svg"], ".svg"),
        }
    return summary, artifacts


def run_study(services: Services, job: Job, control: JobControl, run_claimed: RunClaimed) -> None:
    """The ``study`` job kind (see the module docstring)."""
    study = _study_for_job(services, job.id)
    plan = studies.plan(study.spec, quick=bool(study.params.get("quick")))
    _set_stage(services, study.id, "trainings")
    trained = _trainings(services, study, plan, control)
    _set_stage(services, study.id, "comparison")
    model_ids = list(dict.fromkeys(m.id for m in trained.values()))
    comparison_id = _compare(services, study, plan, model_ids, control, run_claimed)
    _stop_if_asked(control, f"study {study.id}")
    _set_stage(services, study.id, "summary")
    summary, artifacts = _summarize(services, plan, trained, comparison_id)

    def write(s: Session) -> None:
        row = s.get(Study, study.id)
        if row is None:
            raise LostJob(f"study {study.id} was deleted while running")
        row.summary = summary
        row.artifacts = artifacts
        row.comparison_id = comparison_id
        row.stage = "done"

    control.commit(write)
