"""Reading and cancelling a row that carries a job, written once for every collection of them.

A comparison, a study, a training and a job itself each answer ``GET /v1/<collection>/{<kind>_id}``
with the row's view, and ``POST /v1/<collection>/{<kind>_id}/cancel`` by withdrawing the caller's
interest in the job behind the row (:func:`app.jobs.cancel.cancel`: the job stops once nobody
holds it), then with the view again. A :class:`JobBacked` says what differs between them — the
table, how a row is shown, where its job is — and adds both endpoints to the collection's router
as handlers named ``get_<kind>`` and ``cancel_<kind>`` (their operation ids and summaries follow
from the names), with the docstrings the collection gives them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, TypeVar

from fastapi import APIRouter, Path
from pydantic import BaseModel
from sqlalchemy.orm import Session

from app.http.api.deps import Everyone, Requesting, Svc
from app.http.api.rows import row_or_404, view_of
from app.http.schemas import ID_MAX
from app.http.security import READ, WRITE
from app.jobs.cancel import Requester, cancel
from app.store.orm import Comparison, Job, Study, Training
from app.store.services import Services

__all__ = ["JobBacked"]

Row = TypeVar("Row", Comparison, Job, Study, Training)


@dataclass(frozen=True)
class JobBacked(Generic[Row]):
    """A collection whose rows each carry a job: ``table``, ``show(session, row)`` (the row's
    REST view, made while its session is open) and ``job_of(row)`` (its job's id)."""

    table: type[Row]
    show: Callable[[Session, Row], dict[str, Any]]
    job_of: Callable[[Row], int] = attrgetter("job_id")

    @property
    def kind(self) -> str:
        """The row's kind as paths and messages name it: "comparison", "job"."""
        return self.table.__name__.lower()

    def view(self, services: Services, ident: int) -> dict[str, Any]:
        """The view of the row ``ident``, or the 404 that names it."""
        return view_of(services, self.table, ident, self.show)

    def cancel(
        self, services: Services, ident: int, who: Requester, everyone: bool = False
    ) -> dict[str, Any]:
        """Withdraw ``who``'s interest in the job behind the row ``ident`` (``everyone``: stop
        it for every requester, an admin only); once nobody holds the job it stops, at once if
        queued, a running one at its next step. The row's view after it."""
        with services.db.session() as s:
            job_id = self.job_of(row_or_404(s, self.table, ident))
            cancel(s, job_id, who, what=f"{self.kind} {ident}", everyone=everyone)
        return self.view(services, ident)

    def add_routes(
        self,
        router: APIRouter,
        response_model: type[BaseModel],
        *,
        get_doc: str | None = None,
        cancel_doc: str,
    ) -> None:
        """Add ``GET /{<kind>_id}`` and ``POST /{<kind>_id}/cancel`` to ``router``, answering
        ``response_model``; the docstrings are the endpoints' descriptions. Routes match in
        the order they are added: call it where the handlers would stand in the module."""
        param = f"{self.kind}_id"

        def ident_in_path() -> Any:
            # The handlers' own parameter is ``ident``; the path and the OpenAPI document name
            # it by the alias, as a handler written with a parameter of that name would.
            return Path(alias=param, ge=1, le=ID_MAX, description=f"{self.kind.title()} id")

        def get(services: Svc, ident: int = ident_in_path()) -> dict[str, Any]:
            return self.view(services, ident)

        def cancel(
            services: Svc, who: Requesting, ident: int = ident_in_path(), everyone: Everyone = False
        ) -> dict[str, Any]:
            return self.cancel(services, ident, who, everyone)

        get.__doc__, cancel.__doc__ = get_doc, cancel_doc
        for handler in (get, cancel):
            handler.__name__ = handler.__qualname__ = f"{handler.__name__}_{self.kind}"
        path = f"/{{{param}}}"
        router.add_api_route(path, get, methods=["GET"], response_model=response_model, **READ)
        router.add_api_route(
            f"{path}/cancel", cancel, methods=["POST"], response_model=response_model, **WRITE
        )
