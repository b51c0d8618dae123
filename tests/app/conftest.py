"""Fixtures for the service tests: every app test runs on SQLite AND on PostgreSQL.

PostgreSQL is the real server at 127.0.0.1:5432 (database ``test``, user ``postgres``);
each test gets a fresh schema selected through ``search_path``. If the server cannot be
reached the tests FAIL — there is deliberately no skip.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.http.main import create_app
from app.store.settings import Settings

PG_ADMIN = os.environ.get(
    "CKA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DIGITS = ("mixer_digits", "sw_mlp_digits", "rp_mixer_digits", "gmlp_digits", "mlp_digits")
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="session")
def pg_engine() -> Iterator[Any]:
    engine = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:  # fail, never skip: the PostgreSQL pass is required
        pytest.fail(f"PostgreSQL at {PG_ADMIN} is unreachable ({exc}); the app suite needs it")
    yield engine
    engine.dispose()


def _pg_url(schema: str) -> str:
    return f"{PG_ADMIN}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cka.db'}"
        return
    engine = request.getfixturevalue("pg_engine")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    yield _pg_url(schema)
    with engine.connect() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def make_settings(db_url: str, data_dir: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = {
        "database_url": db_url,
        "data_dir": data_dir,
        "worker_threads": 1,
        "poll_s": 0.1,
        "heartbeat_s": 0.2,
        "device": "cpu",
        "broker_url": None,
        "api_tokens": "",
    }
    return Settings(**(base | kw))


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return make_settings(db_url, tmp_path / "data")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def idle_client(settings: Settings) -> Iterator[TestClient]:
    """An app without a worker: jobs stay queued until a test runs them."""
    with TestClient(create_app(settings.model_copy(update={"worker_threads": 0}))) as c:
        yield c


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Randomly initialised checkpoints of the digits presets (no training needed)."""
    import torch

    import models

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("zoo")
    return {name: models.save(models.create(name), out / f"{name}.safetensors") for name in DIGITS}


def upload(client: TestClient, path: Path, name: str | None = None, **headers: str) -> Any:
    with path.open("rb") as w, path.with_suffix(".json").open("rb") as s:
        files = {"weights": ("w.safetensors", w), "sidecar": ("s.json", s)}
        data = {"name": name} if name else {}
        return client.post("/v1/models", files=files, data=data, headers=headers)


def register(client: TestClient, zoo: dict[str, Path], *names: str) -> list[int]:
    ids = []
    for name in names:
        r = upload(client, zoo[name])
        assert r.status_code in (200, 201), r.text
        ids.append(r.json()["id"])
    return ids


def digits_id(client: TestClient) -> int:
    items = client.get("/v1/datasets", params={"q": "digits"}).json()["items"]
    return int(items[0]["id"])


def wait(
    client: TestClient,
    url: str,
    timeout: float = 120.0,
    alive: subprocess.Popen[bytes] | None = None,
) -> dict[str, Any]:
    """Poll ``url`` until its job ends; fail at once if the worker process ``alive`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(url).json()
        if body["status"] in FINAL:
            return body
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the worker exited with {alive.returncode} before {url} ended")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not finish: {body}")
        time.sleep(0.05)
