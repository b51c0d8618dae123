"""Helpers shared by the page modules: the reader, lenient query parsing, rows, pagination.

Rendering a page is :mod:`app.http.web.rendering`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from app.http.schemas import ID_MAX
from app.http.web.auth import AuthState, page_reader
from app.http.web.rendering import PageNotFound
from app.store.services import Services

__all__ = [
    "PAGE_SIZE",
    "Auth",
    "Pager",
    "as_int",
    "as_text",
    "found",
    "is_id",
    "lookup",
    "paged",
    "services_of",
]

PAGE_SIZE = 20
# Every page's reader: who is looking (a page needing a login sends them to it).
Auth = Annotated[AuthState, Depends(page_reader)]
Row = TypeVar("Row")


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def as_int(value: str | None, *, minimum: int = 0, maximum: int = ID_MAX) -> int | None:
    """A query value as an int, or None when absent, malformed or out of range (pages never
    422; the range keeps ids and offsets inside the database's integer columns)."""
    if value is None or not value.strip():
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if minimum <= number <= maximum else None


def as_text(value: str | None, limit: int = 200) -> str | None:
    """A query string as a filter, or None: NULs dropped (PostgreSQL cannot compare them)."""
    return (value or "").replace("\x00", "").strip()[:limit] or None


def is_id(value: int) -> bool:
    """Whether a path id can name a row (ids are 32-bit integer keys)."""
    return 1 <= value <= ID_MAX


def lookup(session: Session, table: type[Row], ident: int) -> Row | None:
    """The row ``ident`` of ``table``; None when there is none or ``ident`` cannot name one
    (then the database is not asked)."""
    return session.get(table, ident) if is_id(ident) else None


def found(session: Session, table: type[Row], ident: int, auth: AuthState) -> Row:
    """The row ``ident`` of ``table``, or :class:`PageNotFound`: the not-found page, which
    names it by its class ("Model 7 does not exist.")."""
    row = lookup(session, table, ident)
    if row is None:
        raise PageNotFound(auth, f"{table.__name__} {ident}")
    return row


@dataclass(frozen=True)
class Pager:
    """Page ``number`` (1-based) of ``total`` items, with links that keep the filters."""

    number: int
    total: int
    size: int
    path: str
    filters: dict[str, Any]

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def first_item(self) -> int:
        return min(self.offset + 1, self.total)

    @property
    def last_item(self) -> int:
        return min(self.offset + self.size, self.total)

    def url(self, number: int) -> str:
        query = {k: v for k, v in self.filters.items() if v not in (None, "")}
        if number > 1:
            query["page"] = number
        return self.path + (f"?{urlencode(query)}" if query else "")

    @property
    def prev_url(self) -> str | None:
        return self.url(self.number - 1) if self.number > 1 else None

    @property
    def next_url(self) -> str | None:
        return self.url(self.number + 1) if self.number < self.pages else None


def paged(
    request: Request,
    page: str | None,
    path: str,
    filters: dict[str, Any],
    lister: Callable[..., tuple[Sequence[Row], int]],
    shown: Callable[[Session, Sequence[Row]], Sequence[Any]] = lambda _s, items: items,
    **where: Any,
) -> tuple[Sequence[Any], Pager]:
    """Page ``?page=`` (1 when absent or malformed) of a listing page at ``path``:
    ``lister(session, limit=, offset=, **where)`` (a repository listing) gives its rows and
    the total, ``shown`` turns the rows into what the template shows while their session is
    open; the pager's links keep ``filters``."""
    number = as_int(page, minimum=1) or 1
    with services_of(request).db.session(readonly=True) as s:
        items, total = lister(s, limit=PAGE_SIZE, offset=(number - 1) * PAGE_SIZE, **where)
        rows = shown(s, items)
    return rows, Pager(number, total, PAGE_SIZE, path, filters)
