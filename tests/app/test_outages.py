"""A part down (issue 36): the answer says "retry later", never "bug".

1. PostgreSQL stopped under a running app: reads and writes answer 503 ``database_unavailable``
   with ``Retry-After`` (the test's own throwaway server), and 200/202 once it is back;
2. a SQLite database locked by another writer past the busy timeout: the write answers 503;
3. the broker unreachable wherever an endpoint meets it: 503 ``broker_unavailable``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import kombu.exceptions
import numpy as np
import pytest
import redis.exceptions
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from app.http.main import create_app
from app.http.problems import install_problem_handlers
from tests.files import npz_bytes
from tests.helpers import digits_id, make_settings, register
from tests.servers import PgServer


def assert_retry_later(r: httpx.Response, code: str, what: str) -> None:
    assert r.status_code == 503, (what, r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json", what
    assert r.json()["code"] == code, (what, r.text)
    assert int(r.headers["retry-after"]) > 0, what
    assert "\n" not in r.json()["detail"], r.text


@pytest.fixture
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of this test alone: stopping it disturbs no other test."""
    with PgServer() as server:
        yield server


def test_a_stopped_database_answers_503_with_retry_after_and_recovers(
    own_pg: PgServer, zoo: dict[str, Path], tmp_path: Path
) -> None:
    settings = make_settings(own_pg.url, tmp_path / "data", worker_threads=0)
    with TestClient(create_app(settings)) as client:
        ids = register(client, zoo, "mixer_digits", "gmlp_digits")
        body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
        upload = {"file": ("x.npz", npz_bytes(x=np.zeros((4, 8, 8), np.float32)))}
        own_pg.stop()
        answers = {
            "list": client.get("/v1/models"),
            "read": client.get(f"/v1/models/{ids[0]}"),
            "page": client.get("/"),
            "compare": client.post("/v1/comparisons", json=body),
            "upload": client.post("/v1/datasets", files=upload),
            "delete": client.delete(f"/v1/models/{ids[1]}"),
        }
        for what, r in answers.items():
            assert_retry_later(r, "database_unavailable", what)
        own_pg.start()
        assert client.get("/v1/models").json()["total"] == 2
        assert client.post("/v1/comparisons", json=body).status_code == 202
        assert client.post("/v1/datasets", files=upload).status_code == 201


def test_a_locked_sqlite_database_answers_503_to_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.store.db.SQLITE_BUSY_S", 0.2)
    path = tmp_path / "cka.db"
    settings = make_settings(f"sqlite:///{path}", tmp_path / "data", worker_threads=0)
    with TestClient(create_app(settings)) as client:
        upload = {"file": ("x.npz", npz_bytes(x=np.zeros((4, 8, 8), np.float32)))}
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            assert_retry_later(
                client.post("/v1/datasets", files=upload), "database_unavailable", "upload"
            )
            assert client.get("/v1/datasets").status_code == 200  # WAL: reads go on
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert client.post("/v1/datasets", files=upload).status_code == 201


@pytest.mark.parametrize(
    "error",
    [
        kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379."),
        redis.exceptions.ConnectionError("Connection refused"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
    ],
)
def test_an_unreachable_broker_answers_503_with_retry_after(error: Exception) -> None:
    app = FastAPI()
    install_problem_handlers(app)

    @app.post("/send")
    def send() -> None:
        raise error

    @app.post("/conflict")
    def conflict() -> None:  # a database error that is no outage stays a 500
        raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))

    with TestClient(app, raise_server_exceptions=False) as client:
        assert_retry_later(client.post("/send"), "broker_unavailable", type(error).__name__)
        assert client.post("/conflict").status_code == 500
