"""Every query of models, datasets, comparisons and trainings (jobs: :mod:`app.jobs.queue`).

Functions take the caller's session, so a request or a job decides the transaction; list
functions return ``(items, total)`` for pagination.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, String, cast, delete, exists, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from app.errors import ProblemError
from app.store.orm import (
    ArtifactRef,
    Comparison,
    ComparisonModel,
    Dataset,
    Job,
    JobState,
    Model,
    ModelAlias,
    Study,
    Training,
)
from app.store.values import ID_MAX

__all__ = [
    "ParamFilter",
    "add_alias",
    "comparison_for_job",
    "comparisons_using_dataset",
    "comparisons_using_model",
    "dataset_by_sha",
    "delete_comparison",
    "delete_trainings_of_dataset",
    "find_comparison_by_hash",
    "get",
    "job_children",
    "job_kinds",
    "job_subjects",
    "list_comparisons",
    "list_datasets",
    "list_jobs",
    "list_models",
    "list_studies",
    "list_trainings",
    "model_by_reference",
    "model_by_sha",
    "page",
    "studies_of_comparisons",
    "study_for_job",
    "training_for_job",
    "trainings_using_dataset",
]

T = TypeVar("T")


def page(session: Session, stmt: Select[Any], limit: int, offset: int) -> tuple[list[Any], int]:
    """One page of ``stmt`` and the total number of rows it selects."""
    total = session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0
    items = list(session.scalars(stmt.limit(limit).offset(offset)).unique())
    return items, int(total)


def get(session: Session, cls: type[T], ident: int) -> T | None:
    return session.get(cls, ident)


def model_by_sha(session: Session, sha: str) -> Model | None:
    return session.scalar(select(Model).where(Model.sha256 == sha))


def add_alias(session: Session, model: Model, name: str) -> None:
    """Record ``name`` as another name of ``model``, unless it is its name or an alias already.

    In a savepoint: a concurrent upload that recorded the same alias first wins, quietly.
    """
    if not name or name == model.name or name in model.aliases:
        return
    try:
        with session.begin_nested():
            model.alias_rows.append(ModelAlias(model_id=model.id, name=name))
    except IntegrityError:
        session.refresh(model, ["alias_rows"])


def dataset_by_sha(session: Session, sha: str) -> Dataset | None:
    return session.scalar(select(Dataset).where(Dataset.sha256 == sha))


def has_builtin_dataset(session: Session, spec: str, split: str) -> bool:
    """Whether built-in dataset ``spec``'s ``split`` has a row (of any content)."""
    query = select(Dataset.id).where(
        Dataset.builtin.is_(True), Dataset.spec == spec, Dataset.split == split
    )
    return session.scalar(query.limit(1)) is not None


def model_by_reference(
    session: Session, ref: int | str, *, listing: str, field: str | None = None
) -> Model:
    """The model ``ref`` names: its id, or a name (or alias) exactly one model has; a string
    of digits that names no model is read as an id. Anything else is a 422 of one sentence
    (``unknown_model``, ``ambiguous_model``) ending with ``listing``: where the models are
    listed, for the caller's user (a URL, a command)."""
    if isinstance(ref, str):
        aliased = select(ModelAlias.model_id).where(ModelAlias.name == ref)
        named = select(Model).where(or_(Model.name == ref, Model.id.in_(aliased)))
        rows = list(session.scalars(named.order_by(Model.id)))
        if len(rows) == 1:
            return rows[0]
        if len(rows) > 1:
            ids = ", ".join(str(m.id) for m in rows)
            raise ProblemError(
                422,
                "ambiguous_model",
                f"{len(rows)} models are named {ref!r} (ids {ids}): name one by its id; {listing}",
                field=field,
            )
        if not ref.isdigit():
            raise ProblemError(
                422, "unknown_model", f"no model is named {ref!r}; {listing}", field=field
            )
    row = session.get(Model, int(ref)) if int(ref) <= ID_MAX else None
    if row is None:
        raise ProblemError(
            422, "unknown_model", f"model {ref} does not exist; {listing}", field=field
        )
    return row


def list_models(
    session: Session,
    *,
    limit: int,
    offset: int,
    arch: str | None = None,
    q: str | None = None,
    source: str | None = None,
    family: str | None = None,
    omega_min: int | None = None,
    omega_max: int | None = None,
    density_min: float | None = None,
    density_max: float | None = None,
    training_key: str | None = None,
) -> tuple[list[Model], int]:
    stmt = select(Model).order_by(Model.id)
    if arch:
        stmt = stmt.where(Model.arch == arch)
    if family:
        stmt = stmt.where(Model.family == family)
    if omega_min is not None:
        stmt = stmt.where(Model.omega >= omega_min)
    if omega_max is not None:
        stmt = stmt.where(Model.omega <= omega_max)
    if density_min is not None:
        stmt = stmt.where(Model.density >= density_min)
    if density_max is not None:
        stmt = stmt.where(Model.density <= density_max)
    if training_key:
        stmt = stmt.where(Model.training_key == training_key)
    if source:
        stmt = stmt.where(Model.source == source)
    if q:
        alias = exists().where(
            ModelAlias.model_id == Model.id, ModelAlias.name.contains(q, autoescape=True)
        )
        stmt = stmt.where(Model.name.contains(q, autoescape=True) | alias)
    return page(session, stmt, limit, offset)


def list_datasets(
    session: Session, *, limit: int, offset: int, q: str | None = None
) -> tuple[list[Dataset], int]:
    stmt = select(Dataset).order_by(Dataset.id)
    if q:
        stmt = stmt.where(Dataset.name.contains(q, autoescape=True))
    return page(session, stmt, limit, offset)


@dataclass(frozen=True)
class ParamFilter:
    """Comparisons whose stored param ``name`` is ``value`` — holds it, with ``contains`` (a
    list, or a layer selection that may be one) — or, with ``or_absent``, does not record it
    (``value`` is its default, and the comparison predates the option)."""

    name: str
    value: str | int | float | bool
    contains: bool = False
    or_absent: bool = False


def _param_is(f: ParamFilter) -> ColumnElement[bool]:
    """:class:`ParamFilter` in SQL, the same on SQLite and PostgreSQL."""
    field = Comparison.params[f.name]
    if f.contains:  # the value's JSON text within the stored JSON text: '"x"' in '["x", "y"]'
        return cast(field, String).contains(json.dumps(f.value), autoescape=True)
    if isinstance(f.value, bool):
        match = field.as_boolean() == f.value
    elif isinstance(f.value, int):
        match = field.as_integer() == f.value
    elif isinstance(f.value, float):
        match = field.as_float() == f.value
    else:
        match = field.as_string() == f.value
    return or_(match, field.as_string().is_(None)) if f.or_absent else match


def list_comparisons(
    session: Session,
    *,
    limit: int,
    offset: int,
    model_id: int | None = None,
    dataset_id: int | None = None,
    status: JobState | None = None,
    kernel: str | None = None,
    params: Sequence[ParamFilter] = (),
) -> tuple[list[Comparison], int]:
    """Newest first; ``params``: every one of these filters on the stored options."""
    # Lists never show the atlas itself: leave the (large) result column unloaded.
    stmt = (
        select(Comparison)
        .join(Job, Comparison.job_id == Job.id)
        .options(defer(Comparison.result))
        .order_by(Comparison.id.desc())
    )
    if model_id is not None:
        stmt = stmt.where(
            exists().where(
                ComparisonModel.comparison_id == Comparison.id,
                ComparisonModel.model_id == model_id,
            )
        )
    if dataset_id is not None:
        stmt = stmt.where(Comparison.dataset_id == dataset_id)
    if status:
        stmt = stmt.where(Job.status == status)
    if kernel:
        stmt = stmt.where(Comparison.kernel == kernel)
    for f in params:
        stmt = stmt.where(_param_is(f))
    return page(session, stmt, limit, offset)


def list_trainings(
    session: Session, *, limit: int, offset: int, status: JobState | None = None
) -> tuple[list[Training], int]:
    stmt = select(Training).join(Job, Training.job_id == Job.id).order_by(Training.id.desc())
    if status:
        stmt = stmt.where(Job.status == status)
    return page(session, stmt, limit, offset)


def list_jobs(
    session: Session,
    *,
    limit: int,
    offset: int,
    kind: str | None = None,
    status: JobState | None = None,
    parent_id: int | None = None,
    roots: bool = False,
) -> tuple[list[Job], int]:
    """Every job of every kind, newest first; ``roots``: only jobs that are nobody's part."""
    stmt = select(Job).order_by(Job.id.desc())
    if roots:
        stmt = stmt.where(Job.parent_id.is_(None))
    if kind:
        stmt = stmt.where(Job.kind == kind)
    if status:
        stmt = stmt.where(Job.status == status)
    if parent_id is not None:
        stmt = stmt.where(Job.parent_id == parent_id)
    return page(session, stmt, limit, offset)


def job_children(session: Session, parent_ids: Sequence[int]) -> dict[int, list[Job]]:
    """``parent id -> its jobs`` (shards, a study's trainings), in the order they were made."""
    out: dict[int, list[Job]] = {}
    stmt = select(Job).where(Job.parent_id.in_(list(parent_ids))).order_by(Job.id)
    for job in session.scalars(stmt):
        out.setdefault(job.parent_id or 0, []).append(job)
    return out


def studies_of_comparisons(
    session: Session, comparison_ids: Sequence[int]
) -> dict[int, tuple[int, str]]:
    """``comparison id -> (study id, study name)`` for the comparisons that are a study's atlas."""
    stmt = select(Study.comparison_id, Study.id, Study.name).where(
        Study.comparison_id.in_(list(comparison_ids))
    )
    return {cid: (sid, name) for cid, sid, name in session.execute(stmt) if cid is not None}


def job_kinds(session: Session) -> list[str]:
    """The kinds of job the table holds (comparison, training, and whatever comes later)."""
    return sorted(session.scalars(select(Job.kind).distinct()))


def job_subjects(session: Session, job_ids: Sequence[int]) -> dict[int, tuple[str, int]]:
    """``job id -> (collection, id)`` of the comparison or training each job produces."""
    ids = list(job_ids)
    out: dict[int, tuple[str, int]] = {}
    for collection, cls in (
        ("comparisons", Comparison),
        ("trainings", Training),
        ("studies", Study),
    ):
        for jid, rid in session.execute(select(cls.job_id, cls.id).where(cls.job_id.in_(ids))):
            out[jid] = (collection, rid)
    return out


def list_studies(
    session: Session,
    *,
    limit: int,
    offset: int,
    name: str | None = None,
    status: JobState | None = None,
) -> tuple[list[Study], int]:
    """Newest first, without the (large) summary column."""
    stmt = (
        select(Study)
        .join(Job, Study.job_id == Job.id)
        .options(defer(Study.summary))
        .order_by(Study.id.desc())
    )
    if name:
        stmt = stmt.where(Study.name == name)
    if status:
        stmt = stmt.where(Job.status == status)
    return page(session, stmt, limit, offset)


def study_for_job(session: Session, job_id: int) -> Study | None:
    return session.scalar(select(Study).where(Study.job_id == job_id))


def find_comparison_by_hash(session: Session, request_hash: str) -> Comparison | None:
    return session.scalar(select(Comparison).where(Comparison.request_hash == request_hash))


def comparison_for_job(session: Session, job_id: int) -> Comparison | None:
    return session.scalar(select(Comparison).where(Comparison.job_id == job_id))


def training_for_job(session: Session, job_id: int) -> Training | None:
    return session.scalar(select(Training).where(Training.job_id == job_id))


def comparisons_using_model(session: Session, model_id: int) -> list[int]:
    stmt = select(ComparisonModel.comparison_id).where(ComparisonModel.model_id == model_id)
    return sorted(set(session.scalars(stmt)))


def comparisons_using_dataset(session: Session, dataset_id: int) -> list[int]:
    return list(session.scalars(select(Comparison.id).where(Comparison.dataset_id == dataset_id)))


def delete_comparison(session: Session, comparison_id: int) -> None:
    """Delete a comparison, its members and its job (a running job loses its owner row)."""
    cmp = session.get(Comparison, comparison_id)
    if cmp is None:
        return
    job_id = cmp.job_id
    session.execute(delete(ArtifactRef).where(ArtifactRef.comparison_id == comparison_id))
    session.execute(delete(ComparisonModel).where(ComparisonModel.comparison_id == comparison_id))
    session.execute(delete(Comparison).where(Comparison.id == comparison_id))
    session.execute(delete(Job).where(Job.id == job_id))
    session.expire_all()


def trainings_using_dataset(session: Session, dataset_id: int) -> list[int]:
    return list(session.scalars(select(Training.id).where(Training.dataset_id == dataset_id)))


def delete_trainings_of_dataset(session: Session, dataset_id: int) -> None:
    job_ids = list(
        session.scalars(select(Training.job_id).where(Training.dataset_id == dataset_id))
    )
    session.execute(delete(Training).where(Training.dataset_id == dataset_id))
    if job_ids:
        session.execute(delete(Job).where(Job.id.in_(job_ids)))
    session.expire_all()
