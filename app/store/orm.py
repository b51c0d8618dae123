"""The database schema as SQLAlchemy 2 typed declarative models.

The ``jobs`` table is the source of truth for work: a comparison or training points at the
job that produces it, and its status, progress and error live on the job row only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column, relationship

__all__ = [
    "FINAL_STATES",
    "JOB_STATES",
    "SCOPES",
    "ApiToken",
    "ArtifactRef",
    "Base",
    "Comparison",
    "ComparisonModel",
    "Dataset",
    "Job",
    "JobRequester",
    "JobState",
    "Model",
    "ModelAlias",
    "Study",
    "StudyMember",
    "Training",
    "UTCDateTime",
    "utcnow",
]


class JobState(StrEnum):
    """Where a job is in its life: queued → running → succeeded | failed | cancelled.

    A running job whose worker dies goes back to queued (see :mod:`app.jobs.queue`).
    """

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def live(self) -> bool:
        """Whether the job may still change (queued or running)."""
        return self in (JobState.QUEUED, JobState.RUNNING)


JOB_STATES = tuple(JobState)
FINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
# Row ids are 32-bit INTEGER keys (PostgreSQL ``integer``); see app.store.values.ID_MAX.


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every database.

    PostgreSQL stores ``timestamptz``; SQLite keeps no zone and hands back naive values, which
    are UTC because only UTC is ever written. Either way Python sees an aware UTC datetime.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value} cannot be stored; use UTC")
        return value.astimezone(UTC)  # SQLite would drop any other offset without converting

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[Any]: JSON,
        datetime: UTCDateTime(),
    }


class Model(Base):
    """A registered checkpoint: weights and sidecar in the artifact store, keyed by sha256."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    arch: Mapped[str] = mapped_column(String(200), index=True)
    source: Mapped[str] = mapped_column(String(20))  # upload | timm | training | zoo
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    sidecar: Mapped[dict[str, Any]] = mapped_column(JSON)
    input_shape: Mapped[list[Any]] = mapped_column(JSON)
    num_classes: Mapped[int | None] = mapped_column(Integer)
    parameters: Mapped[int] = mapped_column(BigInteger)
    connections: Mapped[int | None] = mapped_column(BigInteger)
    default_layers: Mapped[list[Any]] = mapped_column(JSON)
    # The input pipeline (input_size, interpolation, crop_pct, crop_mode, mean, std).
    preprocessing: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    # The architecture's structure (models.structure): family, Ω, effective width m, the
    # SW-MLP's density p, tokens S, channels C and expansion γ; None where undefined.
    family: Mapped[str | None] = mapped_column(String(40), index=True)
    omega: Mapped[int | None] = mapped_column(BigInteger, index=True)
    effective_width: Mapped[int | None] = mapped_column(BigInteger)
    density: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[int | None] = mapped_column(Integer)
    channels: Mapped[int | None] = mapped_column(Integer)
    gamma: Mapped[float | None] = mapped_column(Float)
    # sha256 of (arch, options, seed, dataset sha256, recipe) for models trained by the
    # service (analysis.studies.training_key): a study reuses a model with its key.
    training_key: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Names the same weights were uploaded under after this one (oldest first).
    alias_rows: Mapped[list[ModelAlias]] = relationship(
        lazy="selectin", order_by="ModelAlias.created_at", cascade="all, delete-orphan"
    )

    @property
    def aliases(self) -> list[str]:
        """The model's other names, oldest first (see :class:`ModelAlias`)."""
        return [a.name for a in self.alias_rows]

    @property
    def S(self) -> int | None:
        """Tokens S (the API's name for the ``tokens`` column)."""
        return self.tokens

    @property
    def C(self) -> int | None:
        """Channels C (the API's name for the ``channels`` column)."""
        return self.channels


class ModelAlias(Base):
    """Another name of a model: stored weights uploaded again under a name they did not have.

    A model is its weights (one row per sha256), so a second upload returns the stored model;
    the name it was sent with is kept here rather than dropped, shown with the model and
    matched by the models list's name search.
    """

    __tablename__ = "model_aliases"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(200), primary_key=True, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    """An image dataset: the built-in ``digits`` or an uploaded ``.npz`` / ImageFolder zip."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    spec: Mapped[str | None] = mapped_column(String(100))  # built-in spec, e.g. "digits"
    split: Mapped[str] = mapped_column(String(20), default="test")
    file_sha256: Mapped[str | None] = mapped_column(String(64))
    file_suffix: Mapped[str | None] = mapped_column(String(8))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    n: Mapped[int] = mapped_column(Integer)
    shape: Mapped[list[Any]] = mapped_column(JSON)
    classes: Mapped[list[Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """A unit of background work and its state machine (see :mod:`app.jobs.queue`)."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # comparison | training | study | shard | demo (a study's or the demo's trainings: training,
    # parent the study or the demo)
    kind: Mapped[str] = mapped_column(String(20))
    # Stored as the state's name in a VARCHAR(20), no database enum type: rows written as plain
    # strings before read back as JobState, and no migration is needed.
    status: Mapped[JobState] = mapped_column(
        Enum(
            JobState,
            native_enum=False,
            create_constraint=False,
            length=20,
            values_callable=lambda states: [s.value for s in states],
            validate_strings=True,
        ),
        index=True,
        default=JobState.QUEUED,
    )
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(60))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    heartbeat_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    # A shard: the comparison job it is part of, its index, and what it did (worker, host,
    # batches, seconds) once it succeeded (see app.jobs.shards).
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    shard: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # When a worker's reaper last published this queued job to the broker again (its message
    # may have been lost; app.jobs.reaper.republish_queued): at most once per grace.
    published_at: Mapped[datetime | None] = mapped_column()
    # Who asked for it (app.jobs.cancel), loaded with the job for its views.
    requesters: Mapped[list[JobRequester]] = relationship(
        lazy="selectin", order_by="JobRequester.created_at", viewonly=True
    )


class JobRequester(Base):
    """Who asked for a job, one row each: a deduplicated job is shared by its requesters.

    ``requester`` is a token (``token:ID`` for a database token, ``env:DIGEST`` for one of
    ``CKA_API_TOKENS``), ``anonymous`` when no token is configured (the laptop mode: one
    requester), or a study (``study:ID``) whose atlas it is. A cancel withdraws the
    requester's interest (``withdrawn_at``); the job stops when every requester has withdrawn
    (app.jobs.cancel). A job that is part of another (a shard, a study's training) has no row:
    its parent holds it.
    """

    __tablename__ = "job_requesters"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    requester: Mapped[str] = mapped_column(String(80), primary_key=True, index=True)
    label: Mapped[str | None] = mapped_column(String(200))  # the token's or the study's name
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    withdrawn_at: Mapped[datetime | None] = mapped_column()


class JobProduct:
    """The columns every row a job produces has (a comparison, a training, a study): the
    dataset it is over, its job (joined on every read) and when it was asked for."""

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @declared_attr
    def job(cls) -> Mapped[Job]:
        return relationship(Job, lazy="joined")


class ComparisonModel(Base):
    """Which models a comparison covers, in request order."""

    __tablename__ = "comparison_models"

    comparison_id: Mapped[int] = mapped_column(
        ForeignKey("comparisons.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    label: Mapped[str] = mapped_column(String(220))


class Comparison(JobProduct, Base):
    """A CKA atlas request and, once its job succeeded, its result and provenance."""

    __tablename__ = "comparisons"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Canonical hash of the request; NULL once superseded by a forced re-run.
    request_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    kernel: Mapped[str] = mapped_column(String(20), index=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    result_sha256: Mapped[str | None] = mapped_column(String(64))
    diagnostics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    provenance: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    members: Mapped[list[ComparisonModel]] = relationship(
        order_by=ComparisonModel.position, lazy="selectin", cascade="all, delete-orphan"
    )


class Training(JobProduct, Base):
    """A training run through the job system; ``model_id`` is set when it succeeds."""

    __tablename__ = "trainings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    arch: Mapped[str] = mapped_column(String(200))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"))
    training_key: Mapped[str | None] = mapped_column(String(64), index=True)


# Scopes of API tokens, each including the ones before it: read < write < admin.
SCOPES = ("read", "write", "admin")


class ApiToken(Base):
    """A bearer token made by ``cka-atlas token create``; only its sha256 is kept.

    Tokens are 32 random bytes, so a plain sha256 (no salt, no stretching) is enough: the
    hash cannot be inverted and there is no dictionary to try. ``revoked_at`` set: refused.
    """

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    scope: Mapped[str] = mapped_column(String(10))  # read | write | admin
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))  # the first characters, to recognise it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column()
    revoked_at: Mapped[datetime | None] = mapped_column()


class ArtifactRef(Base):
    """A stored Gram stack, HSIC block or heatmap that a comparison read or wrote.

    ``path`` is relative to the artifact store's root. An artifact no row references is an
    orphan: deleting the last comparison that references it (or ``cka-atlas gc``) removes it.
    """

    __tablename__ = "artifact_refs"

    comparison_id: Mapped[int] = mapped_column(
        ForeignKey("comparisons.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(200), primary_key=True, index=True)
    kind: Mapped[str] = mapped_column(String(10))  # gram | decoded | heatmap
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class StudyMember(Base):
    """One training of a study (an arm's grid point at one seed) and, once done, its model."""

    __tablename__ = "study_members"

    study_id: Mapped[int] = mapped_column(
        ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    training_key: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(200))
    arch: Mapped[str] = mapped_column(String(200))
    seed: Mapped[int] = mapped_column(Integer)
    model_id: Mapped[int | None] = mapped_column(
        ForeignKey("models.id", ondelete="SET NULL"), index=True
    )
    reused: Mapped[bool | None] = mapped_column(Boolean)  # None until the training is done


class Study(JobProduct, Base):
    """A study run: its validated spec, the job running it, its comparison and its results.

    ``summary`` is summary.json; ``artifacts`` maps ``csv``/``png``/``svg`` to the sha256 of
    the results table and plots in the artifact store.
    """

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # seeds, quick, builtin
    comparison_id: Mapped[int | None] = mapped_column(
        ForeignKey("comparisons.id", ondelete="SET NULL")
    )
    stage: Mapped[str] = mapped_column(String(20), default="trainings")
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    artifacts: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    members: Mapped[list[StudyMember]] = relationship(
        order_by=StudyMember.position, lazy="selectin", cascade="all, delete-orphan"
    )
