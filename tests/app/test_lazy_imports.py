"""The server is built, and its start-up work done, without the heavy libraries.

`cka-atlas serve` must answer within seconds of a start: timm (with torchvision) and matplotlib
take longer to import than the rest of the server together, and no request of a start needs
them (they load with the first job, model page or heatmap that does). A fresh interpreter does
what `serve` does before it listens — import the command, build the app, start its lifespan on
a new store, find the demo — and names which of them it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.http.main import create_app
from app.store.db import Database
from app.store.orm import Dataset
from app.store.settings import Settings

HEAVY = ("timm", "torchvision", "matplotlib", "models")

# A first start: the store is made and the demo queued; the demo then finishes.
FIRST = """
from sqlalchemy import update
from app.cli.demo import setup_demo
from app.jobs.runtime import running
from app.store.orm import Job, JobState
from app.store.settings import Settings

settings = Settings()
job_id, queued = setup_demo(settings, None)
assert queued
with running(settings, threads=0) as services, services.db.session() as s:
    s.execute(update(Job).where(Job.id == job_id).values(status=JobState.SUCCEEDED))
"""

# A second start, as `cka-atlas serve --demo --zoo ZOO` makes it up to listening (the zoo
# folder holds the checkpoints of a `cka-atlas demo` run), then its first /healthz.
SECOND = f"""
import json, sys
from fastapi.testclient import TestClient
import app.cli.service
from app.cli.demo import setup_demo
from app.cli.store import ensure_store
from app.http.main import create_app
from app.store.db import Database
from app.store.settings import Settings

settings = Settings()
db = Database(settings.resolved_database_url)
ensure_store(db.engine, settings.data_dir)
db.dispose()
assert setup_demo(settings, sys.argv[1])[1] is False  # found, not queued
with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
    assert client.get("/healthz").status_code == 200
print(json.dumps(sorted(name for name in {HEAVY!r} if name in sys.modules)))
"""


def _python(script: str, *args: str, data_dir: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKA_")}
    env["CKA_DATA_DIR"] = str(data_dir)
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_second_start_serves_without_timm_torchvision_matplotlib_or_models(
    tmp_path: Path,
) -> None:
    data, zoo = tmp_path / "var", tmp_path / "zoo"
    zoo.mkdir()
    _python(FIRST, data_dir=data)
    loaded = json.loads(_python(SECOND, str(zoo), data_dir=data).strip().splitlines()[-1])
    assert loaded == []


def test_a_library_error_is_a_problem_once_the_library_is_loaded() -> None:
    """The service names the libraries' errors without importing them (app.errors)."""
    from analysis.errors import DatasetError
    from app.errors import problem_of
    from models.errors import ConfigError

    assert problem_of(DatasetError("no such dataset")) == (422, "invalid_dataset")
    assert problem_of(ConfigError("no such option")) == (422, ConfigError.code)
    assert problem_of(ValueError("a bug")) is None


def test_a_second_start_checks_the_built_in_datasets_beside_the_server(settings: Settings) -> None:
    """Where the built-in rows exist, their content check (which loads the data) runs in a
    thread beside the server, and the server's shutdown waits for it."""
    with TestClient(create_app(settings, start_worker=False)):
        pass
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as s:
            (real,) = s.scalars(select(Dataset.sha256).where(Dataset.builtin.is_(True)))
            # As after a change to the built-in data: the row no longer holds their content.
            s.execute(update(Dataset).where(Dataset.builtin.is_(True)).values(sha256="0" * 64))
        with TestClient(create_app(settings, start_worker=False)) as client:
            assert client.get("/healthz").status_code == 200
        with db.session(readonly=True) as s:
            shas = set(s.scalars(select(Dataset.sha256).where(Dataset.builtin.is_(True))))
    finally:
        db.dispose()
    assert shas == {"0" * 64, real}
