"""Reading the rows behind the routers: one row or its 404, one row's view, a page of a listing.
Reading and cancelling a row that carries a job is :mod:`app.http.api.job_backed`'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.http.api.deps import PageAt, not_found
from app.store.services import Services

__all__ = ["each", "listing", "row_or_404", "view_of"]

Row = TypeVar("Row")
View = TypeVar("View")


def row_or_404(session: Session, table: type[Row], ident: int, **options: Any) -> Row:
    """The row ``ident`` of ``table`` (``options`` as ``Session.get`` takes them), or the 404
    that names it by the lower-cased class name ("comparison 7 does not exist")."""
    row = session.get(table, ident, **options)
    if row is None:
        raise not_found(table.__name__.lower(), ident)
    return row


def each(view: Callable[[Row], View]) -> Callable[[Session, Sequence[Row]], list[View]]:
    """A listing's ``shown`` that views each row on its own."""
    return lambda _s, items: [view(row) for row in items]


def listing(
    services: Services,
    at: PageAt,
    lister: Callable[..., tuple[Sequence[Row], int]],
    shown: Callable[[Session, Sequence[Row]], Sequence[Any]] = lambda _s, items: items,
    **where: Any,
) -> dict[str, Any]:
    """One page of a list endpoint: ``lister(session, limit=, offset=, **where)`` (a
    repository listing) gives the rows and the total; ``shown`` turns the rows into what
    the answer holds while their session is open."""
    with services.db.session(readonly=True) as s:
        items, total = lister(s, limit=at.limit, offset=at.offset, **where)
        views = shown(s, items)
    return at.answer(views, total)


def view_of(
    services: Services, table: type[Row], ident: int, shown: Callable[[Session, Row], View]
) -> View:
    """``shown(session, row)`` for the row ``ident`` of ``table`` (or its 404), in one read
    session: what the view reads through the row's relations is loaded before it closes."""
    with services.db.session(readonly=True) as s:
        return shown(s, row_or_404(s, table, ident))
