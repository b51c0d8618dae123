"""A page's answer: its template rendered for who is looking, with the security headers every
page carries; and the not-found page, which a page asks for by raising :class:`PageNotFound`."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from app.http.web.auth import AuthState
from app.http.web.templating import templates

__all__ = ["SECURITY_HEADERS", "PageNotFound", "not_found_page", "render"]

# Pages are same-origin only: scripts, styles and images from this server, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


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


class PageNotFound(Exception):
    """What a page raises for a row that does not exist; answered with the not-found page."""

    def __init__(self, auth: AuthState, what: str) -> None:
        super().__init__(what)
        self.auth = auth
        self.what = what
