"""Opening the store from a command: an existing one for the commands that read or change it,
or a new one, said where, for the commands that run the service.

The default store is ``./var`` under the folder a command runs in, so a command run from
another folder would otherwise silently start a new, empty one. The commands that read a
store (``export``, ``study list``, ``db current``, ``token``, ``gc``) therefore never create
one: :func:`open_store` refuses in one sentence that names where it looked and how to point
elsewhere, and leaves no file behind. ``serve``, ``worker``, ``demo``, ``study run`` and
``db upgrade`` create it (:func:`ensure_store`), and say so.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import Engine, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from app.cli.commands import CommandError
from app.store.db import (
    Database,
    current_revision,
    ensure_schema,
    head_revision,
    is_transient,
)
from app.store.settings import Settings

__all__ = ["describe_store", "ensure_store", "open_store"]

# How a newcomer makes a store, and how a command finds one made elsewhere.
_POINT = (
    "set CKA_DATA_DIR to the folder of an existing store (or CKA_DATABASE_URL to its "
    "database), or run `cka-atlas serve` (or `cka-atlas db upgrade`) to create one here"
)


def describe_store(engine: Engine, data_dir: Path) -> str:
    """Where a store lives: its database (password hidden) and its artifact folder."""
    url = engine.url.render_as_string(hide_password=True)
    return f"database {url}, files under {data_dir.resolve()}"


def ensure_store(engine: Engine, data_dir: Path) -> None:
    """:func:`ensure_schema`, saying where a store was created (stderr)."""
    if ensure_schema(engine) == "created":
        print(
            f"cka-atlas: created a new, empty store ({describe_store(engine, data_dir)}); "
            "CKA_DATA_DIR or CKA_DATABASE_URL points a command at an existing one",
            file=sys.stderr,
        )


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite database URL; None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(str(parsed.database))


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


def open_store(settings: Settings, *, schema: bool = True) -> Database:
    """The existing store of ``settings``; :class:`CommandError` if there is none there.

    Nothing is created: a SQLite file that does not exist is never opened (connecting would
    create it and its folder). A database without cka-atlas's tables, one that cannot be
    reached and (with ``schema``) one at another schema revision are refused in one sentence
    too. The caller disposes of the returned database.
    """
    url = settings.resolved_database_url
    shown = make_url(url).render_as_string(hide_password=True)
    file = _sqlite_file(url)
    if file is not None and not file.is_file():
        named = "CKA_DATABASE_URL" if settings.database_url else f"CKA_DATA_DIR={settings.data_dir}"
        raise CommandError(f"there is no store at {file.resolve()} ({named}); {_POINT}")
    db = Database(url)
    try:
        try:
            tables = inspect(db.engine).get_table_names()
            current = current_revision(db.engine) if tables else None
        except SQLAlchemyError as exc:
            if not is_transient(exc):
                raise
            raise CommandError(
                f"cannot reach the database {shown} ({_first_line(exc)}); is it running, and "
                "is CKA_DATABASE_URL right?"
            ) from None
        where = file.resolve() if file is not None else shown
        if not tables:
            raise CommandError(f"{where} holds no store (an empty database); {_POINT}")
        if schema and current != head_revision():
            raise CommandError(
                f"the store at {where} is at schema revision {current or 'unknown'} but this "
                f"code needs {head_revision()}; run `cka-atlas db upgrade` (with the same "
                "CKA_DATA_DIR / CKA_DATABASE_URL) first"
            )
    except BaseException:
        db.dispose()
        raise
    return db
