"""Helpers shared by the page modules: lenient query parsing, rendering, pagination."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import Response

from app.http.schemas import ID_MAX
from app.http.web.auth import AuthState
from app.http.web.templating import templates
from app.store.services import Services

__all__ = [
    "PAGE_SIZE",
    "Pager",
    "as_int",
    "as_text",
    "is_id",
    "not_found_page",
    "render",
    "services_of",
]

PAGE_SIZE = 20

# Pages are same-origin only: scripts, styles and images from this server, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


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


def render(
    request: Request, template: str, auth: AuthState, status: int = 200, **context: Any
) -> Response:
    context.setdefault("title", "")
    response = templates.TemplateResponse(
        request, template, {"auth": auth, **context}, status_code=status
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def not_found_page(request: Request, auth: AuthState, what: str) -> Response:
    return render(
        request, "error.html", auth, 404, title="Not found", message=f"{what} does not exist."
    )


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
