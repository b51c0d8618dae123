"""Shared request dependencies: the services, paging, path ids, and the routers' shape.

Who may call an endpoint is :mod:`app.http.security`'s (``READ``, ``WRITE``, ``ADMIN``); reading
and acting on rows is :mod:`app.http.api.rows`; the rows' REST views are
:mod:`app.http.api.views`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request

from app.http.problems import PROBLEM_RESPONSES, ProblemError
from app.http.schemas import ID_MAX
from app.http.security import Principal, require_write
from app.jobs.cancel import Requester
from app.store.orm import JobState
from app.store.services import Services

__all__ = [
    "ComparisonId",
    "DatasetId",
    "Everyone",
    "Force",
    "ModelId",
    "PageAt",
    "Paging",
    "Requesting",
    "StatusFilter",
    "api_router",
    "get_services",
    "not_finished",
    "not_found",
    "requester_of",
]


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


Svc = Annotated[Services, Depends(get_services)]
Limit = Annotated[int, Query(ge=1, le=500, description="Page size")]
# A list's ``?status=`` filter: one of the job states (their names come from the enum).
StatusFilter = Annotated[JobState | None, Query(alias="status", description="Only this state")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="Items to skip")]
# Ids are 32-bit INTEGER keys: anything outside 1..ID_MAX is refused (422, naming the
# parameter) before it reaches the database, where it would overflow the column type.
ModelId = Annotated[int, Path(ge=1, le=ID_MAX, description="Model id")]
DatasetId = Annotated[int, Path(ge=1, le=ID_MAX, description="Dataset id")]
ComparisonId = Annotated[int, Path(ge=1, le=ID_MAX, description="Comparison id")]
# A cancel's ``?everyone=true``: stop the job for all its requesters, not only the caller.
Everyone = Annotated[
    bool,
    Query(
        description="Stop it for every requester, rather than withdraw only yours (an admin "
        "token only; an admin's cancel of what it did not request does so anyway)"
    ),
]


def requester_of(principal: Annotated[Principal, Depends(require_write)]) -> Requester:
    """The caller of a write as a job's requester (who asks for a job, who cancels one)."""
    return principal.requester


Requesting = Annotated[Requester, Depends(requester_of)]
# A delete's ``?force=true``: delete what uses the row too (else 409 while anything does).
Force = Annotated[
    bool, Query(description="Also delete what uses it: comparisons (a dataset's trainings too)")
]


def api_router(collection: str) -> APIRouter:
    """The router of ``/v1/<collection>``: tagged with the collection, with the problem answers."""
    return APIRouter(prefix=f"/v1/{collection}", tags=[collection], responses=PROBLEM_RESPONSES)


@dataclass(frozen=True)
class PageAt:
    """The window a list endpoint answers: ``limit`` items from ``offset``."""

    limit: int
    offset: int

    def answer(self, items: Sequence[Any], total: int) -> dict[str, Any]:
        """The ``Page`` body of the window's items, of ``total`` in all."""
        return {"items": items, "total": total, "limit": self.limit, "offset": self.offset}


def page_at(limit: Limit = 50, offset: Offset = 0) -> PageAt:
    return PageAt(limit, offset)


# Every list endpoint's ``?limit=&offset=`` (50 from 0 unless asked).
Paging = Annotated[PageAt, Depends(page_at)]


def not_found(kind: str, ident: int | str) -> ProblemError:
    return ProblemError(404, "not_found", f"{kind} {ident} does not exist")


def not_finished(kind: str, ident: int, status: object, what: str) -> ProblemError:
    """The 409 of asking for what a job has not produced (yet): its ``status`` says why."""
    return ProblemError(409, "not_finished", f"{kind} {ident} is {status}; it has no {what} yet")
