"""How the page gets the token: a login field, an HttpOnly cookie, never the URL.

``POST /login`` checks the token typed into the login field (``CKA_API_TOKENS`` or a
database token of any scope) and
stores it in an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over HTTPS); page
scripts never see it. :mod:`app.http.security` accepts that cookie for reads, and for writes
only together with the ``X-CKA-CSRF`` header that the page's scripts add (a cross-site form
cannot). Pages that need a token for reading show the login form with 401 instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.http.access import remember_caller
from app.http.problems import ProblemError
from app.http.security import (
    COOKIE_NAME,
    InvalidToken,
    auth_required,
    authenticate,
    limit_login,
)
from app.http.web.templating import templates

__all__ = ["AuthState", "LoginRequired", "auth_state", "login_page", "page_reader", "router"]

router = APIRouter(include_in_schema=False)
COOKIE_MAX_AGE = 12 * 3600


@dataclass(frozen=True)
class AuthState:
    """What the page needs to know about access, for the header and the forms."""

    tokens_configured: bool
    read_requires_token: bool
    signed_in: bool

    @property
    def can_write(self) -> bool:
        return self.signed_in or not self.tokens_configured

    @property
    def can_read(self) -> bool:
        return self.signed_in or not (self.read_requires_token and self.tokens_configured)


class LoginRequired(Exception):
    """Raised by :func:`page_reader`; answered with the login form and 401."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def _accepted(request: Request, token: str) -> bool:
    """Whether ``token`` is a valid, unrevoked token (environment or database, any scope)."""
    if not token:
        return False
    try:
        principal = authenticate(request.app.state.services, token)
    except InvalidToken:
        return False
    remember_caller(request, principal.name)
    return True


def auth_state(request: Request) -> AuthState:
    services = request.app.state.services
    configured = auth_required(services)
    return AuthState(
        tokens_configured=configured,
        read_requires_token=bool(services.settings.read_requires_token),
        signed_in=configured and _accepted(request, request.cookies.get(COOKIE_NAME, "")),
    )


def page_reader(request: Request) -> AuthState:
    """Dependency of every page: the auth state, or LoginRequired if reads need a token."""
    state = auth_state(request)
    if not state.can_read:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(path)
    return state


def _safe_next(value: str | None) -> str:
    """Only a path on this site: never ``//host``, ``https://host`` or anything a browser
    turns into one (it drops tabs and newlines and reads ``\\`` as ``/``): open redirect."""
    if (
        not value
        or not value.startswith("/")
        or any(c.isspace() or not c.isprintable() or c == "\\" for c in value)
    ):
        return "/"
    parts = urlsplit(value)
    if value.startswith("//") or parts.scheme or parts.netloc:
        return "/"
    return value


def login_page(
    request: Request,
    *,
    next_path: str = "/",
    error: str | None = None,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    context: dict[str, Any] = {
        "auth": auth_state(request),
        "next": _safe_next(next_path),
        "error": error,
        "title": "Sign in",
    }
    return templates.TemplateResponse(
        request, "login.html", context, status_code=status, headers=headers
    )


@router.get("/login")
def get_login(request: Request, next: str = "/") -> Response:
    return login_page(request, next_path=next)


@router.post("/login")
def post_login(
    request: Request,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    """Check the token and keep it in the HttpOnly cookie; 401 with the form again if wrong,
    429 past ``CKA_WRITE_RATE`` sign-ins from one address."""
    try:
        limit_login(request)
    except ProblemError as exc:
        return login_page(
            request, next_path=next, error=exc.detail, status=exc.status, headers=exc.headers
        )
    configured = auth_required(request.app.state.services)
    token = token.strip()
    if configured and not _accepted(request, token):
        return login_page(
            request, next_path=next, error="That token is not accepted here.", status=401
        )
    response = RedirectResponse(_safe_next(next), status_code=303)
    if configured:
        response.set_cookie(
            COOKIE_NAME,
            token,
            max_age=COOKIE_MAX_AGE,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
    return response


@router.post("/logout")
def post_logout() -> Response:
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response
