"""Startup logs: plain lines on a terminal, JSON where ``CKA_LOG_FORMAT=json`` asks; the
schema's revisions one line each, in the order they run."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from app.logs import configure_logging, resolved_format
from app.store.db import alembic_config, upgrade

TEXT_LINE = re.compile(r"\d\d:\d\d:\d\d INFO app\.store\.db: (.*)")
REVISION = re.compile(r"database schema: revision (\d+) of (\d+), (\w+): \S.*")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root, alembic = logging.getLogger(), logging.getLogger("alembic")
    handlers, level, alembic_level = list(root.handlers), root.level, alembic.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    alembic.setLevel(alembic_level)


def _chain() -> list[str]:
    """The revisions from the first to head, read from the scripts' down_revision links."""
    script = ScriptDirectory.from_config(alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _create_store(tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    configure_logging("info", fmt=fmt)
    engine = create_engine(f"sqlite:///{tmp_path / f'{fmt}.db'}")
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    return capsys.readouterr().err.splitlines()


def _revisions(messages: list[str]) -> list[str]:
    found = [m for m in (REVISION.fullmatch(msg) for msg in messages) if m is not None]
    assert found, messages
    assert [int(m.group(1)) for m in found] == list(range(1, len(found) + 1))
    assert {int(m.group(2)) for m in found} == {len(found)}
    return [m.group(3) for m in found]


def test_text_lines_name_each_revision_in_the_order_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    lines = _create_store(tmp_path, "text", capsys)
    assert lines and not any(line.startswith("{") for line in lines), lines
    # alembic's own chatter (its dialect, "Running upgrade a -> b") is not repeated
    assert not any("Context impl" in line or "Running upgrade" in line for line in lines)
    messages = [m.group(1) for m in (TEXT_LINE.fullmatch(line) for line in lines) if m]
    assert len(messages) == len(lines), lines
    assert _revisions(messages) == _chain()


def test_json_lines_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    docs = [json.loads(line) for line in _create_store(tmp_path, "json", capsys)]
    assert docs and all(d["logger"] == "app.store.db" for d in docs), docs
    assert _revisions([d["message"] for d in docs]) == _chain()


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_auto_is_text_on_a_terminal_and_json_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", _Stream(tty=True))
    assert resolved_format("auto") == "text" and resolved_format("json") == "json"
    monkeypatch.setattr(sys, "stderr", _Stream(tty=False))
    assert resolved_format("auto") == "json" and resolved_format("text") == "text"


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("true", True)])
def test_serve_logs_each_request_only_when_asked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_logging: None,
    value: str | None,
    expected: bool,
) -> None:
    """Issue 47: `make run`'s terminal showed 235 access-log lines (a page polls its jobs);
    uvicorn's access log is off unless CKA_ACCESS_LOG turns it on."""
    import uvicorn

    from app.cli import main

    for name in [n for n in os.environ if n.startswith("CKA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CKA_DATA_DIR", str(tmp_path / "var"))
    if value is not None:
        monkeypatch.setenv("CKA_ACCESS_LOG", value)
    seen: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    # no app is built: uvicorn is not run, and building one starts a thread (its OpenAPI)
    monkeypatch.setattr("app.http.main.create_app", lambda settings: object())
    assert main(["serve", "--port", "8799"]) == 0
    assert seen["access_log"] is expected
