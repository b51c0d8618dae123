"""Schema management: alembic from code, auto-upgrade of an empty database, refusal otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from app.cli import main
from app.http.main import create_app
from app.store.db import (
    Database,
    SchemaError,
    current_revision,
    ensure_schema,
    head_revision,
    upgrade,
)
from tests.helpers import make_settings

TABLES = {
    "models",
    "datasets",
    "jobs",
    "comparisons",
    "comparison_models",
    "trainings",
    "studies",
    "study_members",
}


def test_empty_database_is_upgraded_on_start(db_url: str) -> None:
    db = Database(db_url)
    assert current_revision(db.engine) is None
    assert ensure_schema(db.engine) == "created"
    assert current_revision(db.engine) == head_revision()
    assert set(inspect(db.engine).get_table_names()) >= TABLES
    assert ensure_schema(db.engine) == "current"
    db.dispose()


def test_outdated_database_is_refused_with_the_command(db_url: str, tmp_path: Path) -> None:
    db = Database(db_url)
    upgrade(db.engine)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0000_older'"))
    with pytest.raises(SchemaError, match="cka-atlas db upgrade"):
        ensure_schema(db.engine)
    settings = make_settings(db_url, tmp_path / "data")
    with pytest.raises(SchemaError), TestClient(create_app(settings)):
        pass
    db.dispose()


def test_tables_without_alembic_are_refused(db_url: str) -> None:
    db = Database(db_url)
    with db.engine.begin() as conn:
        conn.execute(text("CREATE TABLE stray (id INTEGER PRIMARY KEY)"))
    with pytest.raises(SchemaError, match="db upgrade"):
        ensure_schema(db.engine)
    db.dispose()


def test_db_cli(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CKA_DATABASE_URL", db_url)
    assert main(["db", "current"]) == 2  # no store yet: one sentence, and nothing created
    assert "cka-atlas db upgrade" in capsys.readouterr().err
    assert main(["db", "upgrade"]) == 0
    assert main(["db", "current"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_script_location_is_the_installed_package() -> None:
    import migrations
    from app.store.db import alembic_config

    location = alembic_config().get_main_option("script_location")
    assert location == str(Path(migrations.__file__).parent)
    assert (Path(location) / "versions" / "0001_initial.py").is_file()


def test_0002_adds_structure_and_studies_to_an_existing_database(db_url: str) -> None:
    """A 0001 database keeps its models through 0002 (the new columns start empty), and 0002
    goes back down to 0001."""
    from app.store.db import downgrade

    db = Database(db_url)
    upgrade(db.engine, "0001")
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO models (id, name, arch, source, sha256, size_bytes, config,"
                " sidecar, input_shape, parameters, default_layers, created_at) VALUES"
                " (1, 'm', 'mlp_digits', 'upload', 'ab', 1, '{}', '{}', '[1, 8, 8]', 10, '[]',"
                " CURRENT_TIMESTAMP)"
            )
        )
    upgrade(db.engine)
    assert current_revision(db.engine) == head_revision()
    with db.engine.connect() as conn:
        row = conn.execute(text("SELECT name, omega, density, training_key FROM models")).one()
    assert tuple(row) == ("m", None, None, None)
    assert {"studies", "study_members"} <= set(inspect(db.engine).get_table_names())
    downgrade(db.engine, "0001")
    assert "studies" not in set(inspect(db.engine).get_table_names())
    assert "omega" not in {c["name"] for c in inspect(db.engine).get_columns("models")}
    db.dispose()
