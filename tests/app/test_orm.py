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
