"""A command that reads the store, pointed at none, says so in one sentence and creates nothing.

The commands are taken from docs/cli.md, so a read command documented later is run here too
(every documented command must be classed below as one that reads a store or one that does not).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from app.cli import main
from app.store.db import upgrade
from tests.test_docs_examples import ROOT, _console, blocks

# Commands that read or change an existing store: they must never create one.
READS_STORE = {"export", "study list", "db current", "token list", "token create"}
READS_STORE |= {"token revoke", "token purge", "gc", "models"}
# Commands that use no store, or whose job is to make one (the service, its worker, the demo,
# a study run, the upgrade).
OTHERS = {"train", "zoo", "compare", "import", "demo", "serve", "worker", "study run"}
OTHERS |= {"db upgrade", "study plan"}  # study plan reads a pilot's summary.json
OTHERS |= {"layers"}  # of a checkpoint file (a model of the store by name reads the store)
GROUPS = {"study", "db", "token"}  # commands whose action is their second word


def documented_commands() -> list[list[str]]:
    """Every ``cka-atlas`` command line of docs/cli.md's shell blocks, as argument lists."""
    found = []
    for block in blocks((ROOT / "docs" / "cli.md").read_text(encoding="utf-8")):
        if block.lang == "python":
            continue
        code = _console(block.code) if block.lang == "console" else block.code
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["cka-atlas"]:
                found.append(words[1:])
    return found


def _key(argv: list[str]) -> str:
    return " ".join(argv[:2]) if argv[0] in GROUPS else argv[0]


def _clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("CKA_")]:
        monkeypatch.delenv(name)


def test_every_documented_read_command_in_an_empty_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = documented_commands()
    assert {_key(c) for c in commands} <= READS_STORE | OTHERS, "class the new command above"
    reads = [c for c in commands if _key(c) in READS_STORE]
    assert {_key(c) for c in reads} >= {"export", "study list", "db current", "token list", "gc"}
    _clear_settings(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for argv in reads:
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc != 0, argv
        assert out == "", (argv, out)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert str(tmp_path / "var" / "cka-atlas.db") in err and "CKA_DATA_DIR" in err, err
        assert list(tmp_path.iterdir()) == [], (argv, list(tmp_path.iterdir()))


def test_an_empty_or_outdated_database_and_an_absent_server(
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _clear_settings(monkeypatch)
    monkeypatch.setenv("CKA_DATABASE_URL", db_url)
    monkeypatch.setenv("CKA_DATA_DIR", str(tmp_path / "data"))
    if db_url.startswith("sqlite"):  # an empty file, as an old `export` left behind
        Path(db_url.removeprefix("sqlite:///")).touch()
    assert main(["token", "list"]) == 2
    assert re.fullmatch(
        r"error: .* holds no store \(an empty database\); .*\n", capsys.readouterr().err
    )
    assert main(["db", "current"]) == 2
    assert "`cka-atlas db upgrade`" in capsys.readouterr().err

    engine = create_engine(db_url)
    upgrade(engine, "0005")  # a store a release ago
    engine.dispose()
    assert main(["export", "1"]) == 2
    err = capsys.readouterr().err
    assert "at schema revision 0005" in err and "run `cka-atlas db upgrade`" in err, err
    assert main(["db", "current"]) == 1  # `db current` reads an outdated store, and says so
    assert "outdated" in capsys.readouterr().out
    assert not (tmp_path / "data").exists()  # reading never made the artifact folder

    monkeypatch.setenv("CKA_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:9/none")
    assert main(["gc", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the database postgresql+psycopg://postgres@")
    assert len(err.strip().splitlines()) == 1


def test_an_existing_store_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _clear_settings(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["token", "list"]) == 0
    assert capsys.readouterr().out == "no tokens\n"
    assert main(["study", "list"]) == 0
    assert capsys.readouterr().out.strip().endswith("0 studies")
    with create_engine(f"sqlite:///{tmp_path / 'var' / 'cka-atlas.db'}").connect() as conn:
        assert conn.execute(text("select count(*) from comparisons")).scalar() == 0
