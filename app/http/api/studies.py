"""``/v1/studies``: run a study (a built-in or a spec) as one job; read its summary and plot."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query, Response, status
from sqlalchemy import select
from sqlalchemy.orm import object_session

from app.http.api.deps import Paging, Requesting, StatusFilter, Svc, api_router, not_finished
from app.http.api.job_backed import JobBacked
from app.http.api.rows import each, listing, row_or_404
from app.http.api.views import job_fields
from app.http.schemas import ID_MAX, Page, StudyIn, StudyOut
from app.http.security import READ, WRITE
from app.jobs.studies import submit_study
from app.store import repository
from app.store.orm import Job, Study

__all__ = ["router", "study_view"]

router = api_router("studies")
StudyId = Annotated[int, Path(ge=1, le=ID_MAX, description="Study id")]
MEDIA = {"csv": "text/csv; charset=utf-8", "png": "image/png", "svg": "image/svg+xml"}


def _training_jobs(study: Study) -> dict[str, Job]:
    """The study's training jobs by training key (read in the study row's session)."""
    session = object_session(study)
    if session is None:
        return {}
    stmt = select(Job).where(Job.parent_id == study.job_id, Job.kind == "training")
    return {str((j.detail or {}).get("key")): j for j in session.scalars(stmt)}


def study_view(study: Study, *, with_summary: bool = False) -> dict[str, Any]:
    """The REST shape of a study row: job fields, progress by trainings, models, links.

    ``with_summary`` (one study) adds the spec and each training's job: state, worker and
    seconds.
    """
    base = f"/v1/studies/{study.id}"
    jobs = _training_jobs(study) if with_summary else {}
    members = []
    for m in study.members:
        job = jobs.get(m.training_key)
        members.append(
            {
                "position": m.position,
                "name": m.name,
                "arch": m.arch,
                "seed": m.seed,
                "training_key": m.training_key,
                "model_id": m.model_id,
                "reused": m.reused,
                "job_id": job.id if job else None,
                "status": job.status if job else None,
                "worker": job.worker_id if job else None,
                "seconds": (job.detail or {}).get("seconds") if job else None,
            }
        )
    done = [m for m in study.members if m.reused is not None]
    view = {
        "id": study.id,
        "name": study.name,
        "dataset_id": study.dataset_id,
        "params": study.params,
        "stage": study.stage,
        "trainings": {
            "total": len(members),
            "done": len(done),
            "reused": sum(1 for m in done if m.reused),
            "trained": sum(1 for m in done if not m.reused),
        },
        "models": members,
        "comparison_id": study.comparison_id,
        "job_id": study.job_id,
        "created_at": study.created_at,
        "links": {
            "self": base,
            "summary": f"{base}/summary",
            "results_csv": f"{base}/results.csv",
            "plot_png": f"{base}/plot.png",
            "plot_svg": f"{base}/plot.svg",
            "cancel": f"{base}/cancel",
            "trainings": f"/v1/jobs?parent_id={study.job_id}&kind=training",
            **(
                {"comparison": f"/v1/comparisons/{study.comparison_id}"}
                if study.comparison_id
                else {}
            ),
        },
        **job_fields(study.job),
    }
    if with_summary:
        view["spec"] = study.spec
    return view


# One study's view: with its spec and its trainings' jobs.
STUDIES = JobBacked(Study, lambda _s, study: study_view(study, with_summary=True))


def _get(services: Svc, study_id: int) -> Study:
    with services.db.session(readonly=True) as s:
        study = row_or_404(s, Study, study_id)
        study.members  # noqa: B018 - load the members before the session closes
        return study


@router.post("", response_model=StudyOut, status_code=status.HTTP_202_ACCEPTED, **WRITE)
def create_study(
    services: Svc, body: StudyIn, response: Response, who: Requesting
) -> dict[str, Any]:
    """Check and queue a study (202); poll the Location until ``status`` is final.

    The spec is expanded here: an invalid spec, an option a preset does not take, a dataset
    that is not built in or too many trainings are refused (422) before anything is queued.
    Trainings whose key (arch, options, seed, dataset, recipe) already has a model are
    reused, not trained again.
    """
    study_id, _ = submit_study(services, body, requester=who)
    response.headers["Location"] = f"/v1/studies/{study_id}"
    return STUDIES.view(services, study_id)


@router.get("", response_model=Page[StudyOut], **READ)
def list_studies(
    services: Svc,
    at: Paging,
    name: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z0-9_.-]+$")] = None,
    status_: StatusFilter = None,
) -> dict[str, Any]:
    """Newest first."""
    return listing(
        services, at, repository.list_studies, each(study_view), name=name, status=status_
    )


STUDIES.add_routes(
    router,
    StudyOut,
    get_doc="Status, progress (trainings k of n, then the comparison), models and comparison.",
    cancel_doc="""
    Cancel at once if queued; a running study stops after its current training (or at the
    comparison's next batch). A comparison it adopted from another requester is not stopped:
    the study only stops holding it.

    Only its requester (or an admin token) may; see the comparisons' cancel.
    """,
)


def _finished(services: Svc, study_id: int) -> Study:
    study = _get(services, study_id)
    if study.summary is None or study.artifacts is None:
        raise not_finished("study", study_id, study.job.status, "results")
    return study


@router.get("/{study_id}/summary", **READ)
def get_summary(services: Svc, study_id: StudyId) -> dict[str, Any]:
    """summary.json: per arm accuracy and diagonal CKA (mean, 95 % interval), baselines."""
    summary: dict[str, Any] = _finished(services, study_id).summary or {}
    return summary


def _artifact(services: Svc, study_id: int, kind: Literal["csv", "png", "svg"]) -> Response:
    study = _finished(services, study_id)
    sha = str((study.artifacts or {})[kind])
    body = services.store.path(sha, f".{kind}").read_bytes()
    name = {"csv": "results.csv", "png": "plot.png", "svg": "plot.svg"}[kind]
    headers = {
        "ETag": f'"{sha[:32]}"',
        "Content-Disposition": f'inline; filename="study-{study_id}-{name}"',
    }
    return Response(body, media_type=MEDIA[kind], headers=headers)


@router.get(
    "/{study_id}/results.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}},
    **READ,
)
def get_results_csv(services: Svc, study_id: StudyId) -> Response:
    """Tidy table: one row per model, reference layer and model layer."""
    return _artifact(services, study_id, "csv")


@router.get(
    "/{study_id}/plot.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
    **READ,
)
def get_plot_png(services: Svc, study_id: StudyId) -> Response:
    return _artifact(services, study_id, "png")


@router.get(
    "/{study_id}/plot.svg",
    response_class=Response,
    responses={200: {"content": {"image/svg+xml": {}}}},
    **READ,
)
def get_plot_svg(services: Svc, study_id: StudyId) -> Response:
    return _artifact(services, study_id, "svg")
