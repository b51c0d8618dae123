"""Fixtures for the service tests: every app test runs on SQLite AND on PostgreSQL.

PostgreSQL is the session's server (``postgres_url``, see tests/servers.py); each test gets a
fresh schema selected through ``search_path``. If the server cannot be reached the tests
FAIL — there is deliberately no skip.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, make_url, text

from app.http.main import create_app
from app.store.settings import Settings
from tests.app.fault_tools import CIFAR, SLOW_N, slow_npz
from tests.helpers import DIGITS, make_settings
from tests.servers import PgServer


@pytest.fixture(scope="session")
def pg_engine(postgres_url: str) -> Iterator[Any]:
    engine = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:  # fail, never skip: the PostgreSQL pass is required
        pytest.fail(f"PostgreSQL at {postgres_url} is unreachable ({exc}); the app suite needs it")
    yield engine
    engine.dispose()


def _pg_url(admin_url: str, schema: str) -> str:
    url = make_url(admin_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cka.db'}"
        return
    engine = request.getfixturevalue("pg_engine")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    yield _pg_url(request.getfixturevalue("postgres_url"), schema)
    with engine.connect() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of this test alone: stopping it disturbs no other test."""
    with PgServer() as server:
        yield server


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


@pytest.fixture(scope="session")
def cifar_zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two 32x32 presets, heavy enough that a comparison lasts a few seconds on a CPU."""
    import torch

    import models

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("cifar-zoo")
    return {name: models.save(models.create(name), out / f"{name}.safetensors") for name in CIFAR}


@pytest.fixture(scope="session")
def slow_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return slow_npz(tmp_path_factory.mktemp("slow") / "slow.npz", SLOW_N)
