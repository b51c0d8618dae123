"""Upgrades keep every row: every released schema, populated, upgraded to head and served.

A *template* store is filled once per session by this code through its REST API (uploads, a
training, a comparison, a study, a token, and a sharded comparison for the newest schema).
For each released revision the test makes an empty database at that revision, copies the
template's rows into it (the columns and tables that revision has), upgrades it to head with
``cka-atlas db upgrade``, checks that every row kept every value, and reads it through the
API: the stored atlas and matrices as stored, cells and heatmap served, the token still
valid, and a new comparison over the old models runs. On SQLite and on PostgreSQL.

``first_release.sql`` is a store written by the first release's own code (see
``upgrade_data/make_first_release.py``); it is upgraded by the command and its comparison is
served bit-identical.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, Table, select, text

from app.cli import main
from app.http.api import results
from app.http.main import create_app
from app.store.db import Database, current_revision, head_revision, upgrade
from app.store.services import Services
from app.store.tokens import create_token
from tests.app.study_tools import TINY, FakeTrainer
from tests.helpers import digits_id, make_settings, register, wait

# The released schemas in the order they were released (the chain 0001 → 0003 → 0004 →
# 0002 → 0005 → 0006); the last is today's head, upgraded as a no-op but kept for the next
# revision.
RELEASED = ("0001", "0003", "0004", "0002", "0005", "0006")
SHARDS_SINCE = "0005"
# Parents before children, so that the copy satisfies every foreign key as it goes.
TABLES = (
    "datasets",
    "models",
    "jobs",
    "comparisons",
    "comparison_models",
    "artifact_refs",
    "trainings",
    "api_tokens",
    "studies",
    "study_members",
    "job_requesters",
)
# the tiny study with one seed and the RP-Mixer as its only arm
STUDY = {**TINY, "name": "upgrade", "seeds": 1, "arms": [{"name": "rp", "arch": "rp_mixer_digits"}]}
DATA = Path(__file__).parent / "upgrade_data"


@dataclass(frozen=True)
class Template:
    """A store filled by today's code: its database files (without and with shard jobs), its
    artifact directory, and the secret of its write token."""

    released: Path
    head: Path
    data_dir: Path
    token: str


def _sqlite_copy(source: Path, target: Path) -> None:
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory, zoo: dict[str, Path]) -> Iterator[Template]:
    root = tmp_path_factory.mktemp("template")
    db = root / "store.db"
    settings = make_settings(f"sqlite:///{db}", root / "data")
    fake = FakeTrainer()

    def fake_training(*args: Any, on_step: Any = None, **kw: Any) -> Path:
        return fake(*args, **kw)

    with pytest.MonkeyPatch.context() as mp, TestClient(create_app(settings)) as c:
        mp.setattr("app.jobs.study.train", fake)
        mp.setattr("app.jobs.train.train", fake_training)
        ds = digits_id(c)
        ids = register(c, zoo, "mixer_digits", "rp_mixer_digits")
        r = c.post("/v1/trainings", json={"arch": "mixer_digits", "dataset_id": ds, "seed": 3})
        ids.append(wait(c, r.headers["location"])["model_id"])
        r = c.post("/v1/comparisons", json={"model_ids": ids, "dataset_id": ds, "batch_size": 150})
        assert wait(c, r.headers["location"])["status"] == "succeeded"
        r = c.post("/v1/studies", json={"spec": STUDY, "quick": True})
        assert r.status_code == 202, r.text
        assert wait(c, r.headers["location"], timeout=300)["status"] == "succeeded"
        services: Services = c.app.state.services  # type: ignore[attr-defined]
        with services.db.session() as s:
            _, secret = create_token(s, "upgrade test", "write")
        released = root / "released.db"
        _sqlite_copy(db, released)
        body = {"model_ids": ids[:2], "dataset_id": ds, "shards": 2}
        r = c.post("/v1/comparisons", json=body, headers={"Authorization": f"Bearer {secret}"})
        assert wait(c, r.headers["location"])["status"] == "succeeded", r.text
    yield Template(released, db, root / "data", secret)


def _tables(engine: Engine) -> dict[str, Table]:
    meta = MetaData()
    meta.reflect(engine)
    return {name: meta.tables[name] for name in TABLES if name in meta.tables}


def _rows(engine: Engine, tables: dict[str, Table]) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, ordered by primary key, with aware UTC timestamps."""
    out = {}
    with engine.connect() as conn:
        for name, table in tables.items():
            rows = conn.execute(select(table).order_by(*table.primary_key.columns)).mappings()
            out[name] = [{k: _aware(v) for k, v in row.items()} for row in rows]
    return out


def _aware(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # SQLite keeps no zone; only UTC is written
    return value


def _populate(db: Database, source: Path, revision: str) -> dict[str, list[dict[str, Any]]]:
    """Rows of ``source`` (a head store) in ``db`` at ``revision``: the columns it has."""
    upgrade(db.engine, revision)
    have = _tables(db.engine)
    template = Database(f"sqlite:///{source}")
    rows = _rows(template.engine, _tables(template.engine))
    template.dispose()
    with db.engine.begin() as conn:
        for name, table in have.items():
            keep = set(table.columns.keys())
            naive = db.is_sqlite
            for row in rows[name]:
                values = {k: v for k, v in row.items() if k in keep}
                if naive:
                    values = {
                        k: v.replace(tzinfo=None) if isinstance(v, datetime) else v
                        for k, v in values.items()
                    }
                conn.execute(table.insert().values(**values))
        if not db.is_sqlite:  # explicit ids: move each sequence past them, as a restore does
            for name, table in have.items():
                if "id" in table.columns:
                    conn.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), max(id)) "
                            f"FROM {name}"
                        )
                    )
    return _rows(db.engine, have)


def _served_as_stored(c: TestClient, stored: list[dict[str, Any]], auth: dict[str, str]) -> None:
    """Each finished comparison: its atlas, every matrix, the cells and heatmap, as stored."""
    results._atlases.clear()  # read from this database, not from an earlier test's cache
    for cmp in stored:
        if cmp["result"] is None:
            continue
        url = f"/v1/comparisons/{cmp['id']}"
        body = c.get(f"{url}/result", headers=auth)
        assert body.status_code == 200, body.text
        assert body.json()["atlas"] == cmp["result"]
        for entry in cmp["result"]["matrices"]:
            m = c.get(f"{url}/matrix", params={"a": entry["a"], "b": entry["b"]}, headers=auth)
            assert m.status_code == 200, m.text
            assert m.json()["values"] == entry["cka"]  # bit-identical floats
        png = c.get(f"{url}/heatmap.png", headers=auth)
        assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
        csv = c.get(f"{url}/cells.csv", headers=auth)
        assert csv.status_code == 200
        cells = sum(len(e["cka"]) * len(e["cka"][0]) for e in cmp["result"]["matrices"])
        assert len(csv.text.strip().splitlines()) == 1 + cells


@pytest.mark.parametrize("revision", RELEASED)
def test_a_populated_store_at_each_released_schema_upgrades_and_is_served(
    revision: str,
    db_url: str,
    tmp_path: Path,
    template: Template,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = Database(db_url)
    source = template.head if revision >= SHARDS_SINCE else template.released
    before = _populate(db, source, revision)
    assert all(before[name] for name in before), {k: len(v) for k, v in before.items()}
    assert current_revision(db.engine) == revision
    data_dir = tmp_path / "data"
    shutil.copytree(template.data_dir, data_dir)

    monkeypatch.setenv("CKA_DATABASE_URL", db_url)
    assert main(["db", "upgrade"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert current_revision(db.engine) == head_revision()
    if db.is_sqlite and revision != head_revision():
        backup = Path(out.split("copied the database to ")[1].split(" before upgrading")[0])
        assert backup.parent == Path(db.engine.url.database or "").parent
        with closing(sqlite3.connect(backup)) as kept:
            assert kept.execute("SELECT version_num FROM alembic_version").fetchall() == [
                (revision,)
            ]

    after = _rows(db.engine, _tables(db.engine))
    for name, rows in before.items():  # every row, every value it had
        assert [{k: row[k] for k in rows[0]} for row in after[name]] == rows, name
    db.dispose()

    tokens = "api_tokens" in before
    auth = {"Authorization": f"Bearer {template.token}"} if tokens else {}
    settings = make_settings(db_url, data_dir)
    with TestClient(create_app(settings)) as c:
        _served_as_stored(c, before["comparisons"], auth)
        training = c.get("/v1/trainings/1").json()
        assert training["model_id"] == before["trainings"][0]["model_id"]
        assert training["status"] == "succeeded"
        if "studies" in before:
            study = c.get("/v1/studies/1").json()
            assert study["status"] == "succeeded"
            assert study["comparison_id"] == before["studies"][0]["comparison_id"]
        ids = [m["id"] for m in before["models"]]
        body = {"model_ids": ids, "dataset_id": before["datasets"][0]["id"], "batch_size": 90}
        if tokens:  # the stored token still decides who may write
            assert c.post("/v1/comparisons", json=body).status_code == 401
        r = c.post("/v1/comparisons", json=body, headers=auth)
        assert r.status_code == 202, r.text
        done = wait(c, r.headers["location"])
        assert done["status"] == "succeeded", done
        assert [m["id"] for m in done["models"]] == ids


def _first_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *changes: str) -> Path:
    """The first release's SQLite store at ``tmp_path/cka.db`` with the SQL ``changes`` made
    to it; CKA_DATABASE_URL names it."""
    path = tmp_path / "cka.db"
    with closing(sqlite3.connect(path)) as db:
        db.executescript((DATA / "first_release.sql").read_text(encoding="utf-8"))
        for change in changes:
            db.execute(change)
        db.commit()
    monkeypatch.setenv("CKA_DATABASE_URL", f"sqlite:///{path}")
    return path


def test_the_first_release_store_is_upgraded_by_the_command_and_served_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQLite store written by the code of 2026-11-22 (schema 0001)."""
    path = _first_release(tmp_path, monkeypatch)
    with closing(sqlite3.connect(path)) as db:
        stored = db.execute("SELECT id, result FROM comparisons").fetchall()
    assert stored
    url = f"sqlite:///{path}"
    assert main(["db", "upgrade"]) == 0
    out = capsys.readouterr().out
    assert f"copied the database to {tmp_path}" in out and "database at" in out
    assert current_revision(Database(url).engine) == head_revision()
    comparisons = [{"id": i, "result": json.loads(r)} for i, r in stored]
    with TestClient(create_app(make_settings(url, tmp_path / "data"))) as c:
        _served_as_stored(c, comparisons, {})


def test_upgrading_a_new_store_copies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cka-atlas db upgrade` on an empty data directory (a new container volume) creates the
    database and keeps no copy of the empty file that connecting made."""
    monkeypatch.delenv("CKA_DATABASE_URL", raising=False)
    monkeypatch.setenv("CKA_DATA_DIR", str(tmp_path))
    assert main(["db", "upgrade"]) == 0
    assert "copied" not in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["cka-atlas.db"]


def test_a_failed_upgrade_names_the_revision_and_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row referring to a missing model (possible with enforcement off) stops the upgrade
    at the first revision's foreign-key check; the database stays at 0001, and the message
    says where the copy is."""
    path = _first_release(
        tmp_path, monkeypatch, "INSERT INTO comparison_models VALUES (1, 9, 999, 'ghost')"
    )
    assert main(["db", "upgrade"]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip()
    assert "\n" not in error and "Traceback" not in error
    assert "failed in revision 0003" in error and "comparison_models" in error
    backup = error.split("the copy made before the upgrade is ")[1]
    assert Path(backup).is_file() and Path(backup).parent == tmp_path
    assert current_revision(Database(f"sqlite:///{path}").engine) == "0001"


def test_a_revision_this_code_does_not_know_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _first_release(tmp_path, monkeypatch, "UPDATE alembic_version SET version_num = '0099'")
    assert main(["db", "upgrade"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "revision 0099, which this code does not know" in error
