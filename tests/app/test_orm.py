"""The ORM's own types: UTC timestamps on every database, job states as one enum."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from app.store.db import Database, ensure_schema
from app.store.orm import Job, JobState


def test_timestamps_come_back_aware_and_utc(db_url: str) -> None:
    db = Database(db_url)
    ensure_schema(db.engine)
    plus_two = datetime(2025, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    with db.session() as s:
        s.add(Job(kind="comparison", status=JobState.QUEUED, created_at=plus_two))
    with db.session(readonly=True) as s:
        job = s.scalars(select(Job)).one()
    # SQLite keeps no zone at all; PostgreSQL answers in the session's zone: both read as UTC.
    assert job.created_at.tzinfo is UTC
    assert job.created_at == datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    assert job.status == "queued" == JobState.QUEUED
    db.dispose()


def test_naive_timestamps_are_refused(db_url: str) -> None:
    db = Database(db_url)
    ensure_schema(db.engine)
    with pytest.raises(Exception, match="naive datetime"), db.session() as s:
        s.add(Job(kind="comparison", status=JobState.QUEUED, created_at=datetime(2025, 3, 1)))
    db.dispose()


def test_job_states() -> None:
    assert [s.value for s in JobState] == ["queued", "running", "succeeded", "failed", "cancelled"]
    assert [s.live for s in JobState] == [True, True, False, False, False]


def test_job_status_is_the_enum_and_old_rows_read_back(db_url: str) -> None:
    """The column holds the state's name as before (a VARCHAR, no database enum), so rows
    written as plain strings read back as JobState and the schema needs no migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import text

    from app.store.orm import Base

    db = Database(db_url)
    ensure_schema(db.engine)
    with db.engine.begin() as conn:  # as an older version wrote it: the bare string
        conn.execute(
            text(
                "INSERT INTO jobs (kind, status, progress, cancel_requested, attempts, created_at)"
                " VALUES ('comparison', 'cancelled', 0, false, 0, CURRENT_TIMESTAMP)"
            )
        )
        stored = conn.execute(text("SELECT status FROM jobs")).scalar_one()
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert stored == "cancelled"
    assert [d for d in diff if "status" in str(d)] == []
    with db.session(readonly=True) as s:
        job = s.scalars(select(Job)).one()
        assert job.status is JobState.CANCELLED
        assert s.scalar(select(Job.id).where(Job.status == JobState.CANCELLED)) == job.id
    with db.session() as s:
        s.add(Job(kind="training", status=JobState.RUNNING))
    with db.engine.connect() as conn:
        names = conn.execute(text("SELECT status FROM jobs ORDER BY id")).scalars().all()
    assert names == ["cancelled", "running"]
    db.dispose()
