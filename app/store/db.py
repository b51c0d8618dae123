"""Engine factory, the one session context manager, and migrations run from code.

SQLite connections get WAL, a busy timeout and foreign keys; PostgreSQL goes through
psycopg 3. The schema is owned by alembic (package :mod:`migrations`, found through its
import path so it works from an installed wheel). On start an *empty* database is upgraded
automatically; a database at an older revision is refused with the command to run.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

import migrations
from app.store.orm import Base

__all__ = [
    "Database",
    "SchemaError",
    "UpgradeError",
    "alembic_config",
    "backup_sqlite",
    "current_revision",
    "downgrade",
    "ensure_schema",
    "head_revision",
    "is_transient",
    "make_engine",
    "retry",
    "upgrade",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


# How long a SQLite writer waits for another one's lock before "database is locked".
SQLITE_BUSY_S = 30.0


class SchemaError(RuntimeError):
    """The database schema does not match this code and must be upgraded by hand."""


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event emit BEGIN itself (see _sqlite_begin).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_S * 1000)}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    # A deferred transaction that reads and then writes fails at once with "database is
    # locked" when another writer committed in between; writers therefore take the write
    # lock up front (BEGIN IMMEDIATE) and wait on the busy timeout. Read-only sessions
    # (execution option cka_write=False) stay deferred so readers never queue behind writers.
    write = conn.get_execution_options().get("cka_write", True)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def make_engine(url: str) -> Engine:
    """An engine for ``url``; plain ``postgresql://`` is routed to psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_S},
            pool_pre_ping=True,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # pool_pre_ping replaces connections a server restart killed; connect_timeout bounds a
    # connect to a host that does not answer, so callers' retries keep their pace.
    return create_engine(
        parsed,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        connect_args={"connect_timeout": 5},
    )


# What SQLite says when its file is locked by another writer past the busy timeout, or cannot
# be opened or read (a vanished directory, a failing disk): the database is away, not wrong.
_SQLITE_AWAY = ("locked", "busy", "unable to open", "disk i/o error")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is the database being away (restart, lost connection, lock, a full
    connection pool): worth retrying, and over HTTP a 503, never a 500."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, InterfaceError | PoolTimeout):
        return True
    if isinstance(exc, OperationalError):
        if type(exc.orig).__module__.startswith("sqlite3"):  # also "no such table" and the like
            return any(word in str(exc.orig).lower() for word in _SQLITE_AWAY)
        return True  # psycopg: connection refused, terminated by the administrator, ...
    return False


def retry(fn: Callable[[], T], *, timeout: float, what: str) -> T:
    """Call ``fn`` until it returns, retrying transient database errors with backoff.

    Anything else, and a transient error past ``timeout`` seconds, propagates.
    """
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("%s failed (%s); retrying in %.1f s", what, first, delay)
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


class Database:
    """An engine plus its session factory; :meth:`session` is the only way to get a session."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._read_engine = self.engine.execution_options(cka_write=False)

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """A session committed on success and rolled back on any exception.

        ``readonly=True`` is for sessions that only read; on SQLite they do not take the
        write lock.
        """
        session = self._factory(bind=self._read_engine) if readonly else self._factory()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config() -> Config:
    """Alembic configuration built in code, pointing at the installed ``migrations`` package.

    It hands the ORM's metadata to migrations/env.py (``attributes``), so that package imports
    nothing from :mod:`app`: app imports migrations, never the reverse.
    """
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["target_metadata"] = Base.metadata
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


class UpgradeError(SchemaError):
    """A migration failed; its transaction was rolled back, so the schema is where it was."""

    def __init__(self, start: str | None, revision: str, reason: str) -> None:
        self.start = start
        self.revision = revision
        self.reason = reason
        super().__init__(
            f"the upgrade from {start or 'an empty database'} failed in revision {revision} "
            f"({reason}); the database was left at {start or 'no revision'}"
        )


def _reason(exc: BaseException) -> str:
    """The first line of what the database (or a migration) said."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


def _sqlite_foreign_keys(conn: Connection, *, on: bool) -> None:
    # Straight on the driver's connection: through SQLAlchemy the statement would open a
    # transaction first (see _sqlite_begin), and inside one SQLite ignores this pragma.
    driver = conn.connection.driver_connection
    assert driver is not None  # a checked-out connection always has one
    driver.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def _sqlite_foreign_key_violation(conn: Connection) -> str | None:
    """The first row that refers to a missing parent, in words; None if there is none."""
    row = conn.exec_driver_sql("PRAGMA foreign_key_check").first()
    if row is None:
        return None
    table, rowid, parent, _ = row
    return f"foreign key check: row {rowid} of {table} refers to a missing row of {parent}"


@contextmanager
def _migration_connection(engine: Engine) -> Iterator[Connection]:
    """The one connection migrations run on, inside one transaction.

    SQLite changes a table's definition by rebuilding it (create the new table, copy the rows,
    drop the old one, rename), and with foreign-key enforcement on, the drop of a table that
    other rows refer to fails. So, as SQLite's documentation prescribes, enforcement is off
    for this connection while migrations run, each revision is followed by
    ``PRAGMA foreign_key_check`` (see :func:`upgrade`), and enforcement is back on after.
    On PostgreSQL DDL is transactional and constraints stay enforced throughout.
    """
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _sqlite_foreign_keys(conn, on=False)
        try:
            with conn.begin():
                yield conn
        finally:
            if sqlite:
                _sqlite_foreign_keys(conn, on=True)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` on ``engine``'s database, all or nothing.

    Revisions run one at a time in one transaction; a failure, or (on SQLite) a row left
    referring to a missing parent, raises :class:`UpgradeError` naming the revision, and the
    transaction's rollback leaves the database at the revision it started from.
    """
    cfg = alembic_config()
    start = current_revision(engine)
    script = ScriptDirectory.from_config(cfg)
    try:
        pending = list(script.iterate_revisions(revision, start or "base"))
    except RevisionError:
        raise SchemaError(
            f"the database is at schema revision {start}, which this code does not know "
            f"(written by a newer release?), or {revision!r} is not a revision; nothing was "
            "changed"
        ) from None
    steps = [(r.revision, (r.doc or "").strip().splitlines()) for r in reversed(pending)]
    with _migration_connection(engine) as conn:
        cfg.attributes["connection"] = conn
        for position, (step, doc) in enumerate(steps, 1):
            # One line per revision, in the order they run (the chain's order, which is not
            # that of the ids: 0002 was written after 0004).
            log.info(
                "database schema: revision %d of %d, %s: %s",
                position,
                len(steps),
                step,
                doc[0] if doc else "",
            )
            try:
                command.upgrade(cfg, step)
                broken = (
                    _sqlite_foreign_key_violation(conn) if conn.dialect.name == "sqlite" else None
                )
            except Exception as exc:
                raise UpgradeError(start, step, _reason(exc)) from exc
            if broken is not None:
                raise UpgradeError(start, step, broken)


def downgrade(engine: Engine, revision: str) -> None:
    """Undo migrations down to ``revision``, in one transaction, on the migrations' connection."""
    cfg = alembic_config()
    with _migration_connection(engine) as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        if conn.dialect.name == "sqlite" and (broken := _sqlite_foreign_key_violation(conn)):
            raise SchemaError(f"the downgrade to {revision} failed ({broken})")


def backup_sqlite(engine: Engine) -> Path | None:
    """Copy a SQLite database next to its file, as ``<name>.<revision>-<UTC time>.bak``.

    Through SQLite's backup API, so the copy is one consistent database, rows still in the
    write-ahead log included (a plain file copy could miss them). None when the database is not
    a SQLite file, or the file does not exist yet or holds no table (a new store: connecting
    made it).
    """
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    path = Path(url.database)
    if not path.is_file() or not inspect(engine).get_table_names():
        return None
    stem = f"{path.name}.{current_revision(engine) or 'unversioned'}-"
    stem += datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{stem}.bak")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{stem}-{n}.bak")
    with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(target)) as copy:
        source.backup(copy)
    return target


def ensure_schema(engine: Engine) -> str:
    """Upgrade an empty database; refuse one at another revision. Returns the action taken."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return "current"
    if current is None and not inspect(engine).get_table_names():
        upgrade(engine)
        return "created"
    raise SchemaError(
        f"the database is at schema revision {current or 'unknown (tables without alembic)'} "
        f"but this code needs {head}; run `cka-atlas db upgrade` (with the same "
        "CKA_DATABASE_URL) and start again"
    )
