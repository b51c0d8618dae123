"""Bearer tokens with scopes, write rate limits, the upload size limit, model options.

Tokens come from the database (``cka-atlas token create``, scope ``read``, ``write`` or
``admin``, each including the ones before it) and from ``CKA_API_TOKENS``, whose tokens
keep the full access they always had (write and admin). With neither configured the
service is open (a laptop default); once any token exists, writes need a ``write`` token,
deletes and token management an ``admin`` one, and reads one of any scope when
``CKA_READ_REQUIRES_TOKEN``. A wrong or revoked token is 401, a token whose scope is too
small 403, both as problem+json. Every write is then counted against ``CKA_WRITE_RATE``
per token (per client address without one): see :mod:`app.http.ratelimit`.

Every request's ``Host`` must be one of the service's names (``Settings.host_names``; DNS
rebinding), and every write (POST, PUT, PATCH, DELETE) whose ``Origin`` — or, without one,
``Referer`` — names another origin is refused with 403, with or without tokens: in open mode
a page on any other site could otherwise write through the visitor's browser. Clients that
send neither header (scripts, curl) are not browsers and are not affected.

The body limit is enforced while the request body streams in, before multipart parsing
spools anything to disk: a declared ``Content-Length`` over the limit is refused at once,
and a chunked body is cut off as soon as it crosses the limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from fastapi import Depends, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.access import remember_caller
from app.http.problems import ProblemError, problem_response
from app.jobs.cancel import ANONYMOUS, Requester
from app.store import tokens as token_store
from app.store.services import Services
from app.store.settings import Settings

__all__ = [
    "ADMIN",
    "COOKIE_NAME",
    "CSRF_HEADER",
    "READ",
    "TOKEN_KINDS",
    "WRITE",
    "BodyLimitMiddleware",
    "InvalidToken",
    "OriginMiddleware",
    "Principal",
    "auth_required",
    "authenticate",
    "limit_login",
    "require_admin",
    "require_read",
    "require_write",
    "token_valid",
]


# The web page's login sets this HttpOnly, SameSite=Strict cookie holding the token. It
# authorises reads; it authorises a write only together with CSRF_HEADER, a custom header
# that a cross-site form cannot send (and cross-origin scripts cannot without CORS).
COOKIE_NAME = "cka_token"
CSRF_HEADER = "x-cka-csrf"


@dataclass(frozen=True)
class Principal:
    """Who is asking: the scope they hold and the key their writes are counted under.

    ``anonymous``: the service has no tokens, so nobody can be told apart (the laptop mode).
    """

    scope: str
    key: str
    name: str | None = None
    anonymous: bool = False

    @property
    def requester(self) -> Requester:
        """This principal as a job's requester (:mod:`app.jobs.cancel`): its token (the key
        writes are counted under), or without tokens the one ``anonymous`` requester, who is
        an admin as everybody is then."""
        return Requester(
            ANONYMOUS if self.anonymous else self.key,
            self.name,
            admin=token_store.scope_allows(self.scope, "admin"),
        )


def token_valid(tokens: frozenset[str], token: str) -> bool:
    """Whether ``token`` is one of ``tokens`` (constant-time per candidate)."""
    return bool(token) and any(hmac.compare_digest(token.encode(), t.encode()) for t in tokens)


def auth_required(services: Services) -> bool:
    """Whether any token exists (environment, or a database row even if revoked).

    Revoking every token therefore locks the service rather than opening it.
    """
    if services.settings.tokens:
        return True
    with services.db.session(readonly=True) as s:
        return token_store.tokens_exist(s)


class InvalidToken(Exception):
    """The presented token is unknown, or revoked (``revoked``: the token's name and when)."""

    def __init__(self, revoked: tuple[str, datetime] | None = None) -> None:
        super().__init__("revoked" if revoked else "unknown")
        self.revoked = revoked


def authenticate(services: Services, token: str) -> Principal:
    """The principal of a presented token; raises :class:`InvalidToken`."""
    digest = hashlib.sha256(token.encode()).hexdigest()[:16]
    if token_valid(services.settings.tokens, token):
        return Principal("admin", f"env:{digest}", "CKA_API_TOKENS")
    with services.db.session(readonly=True) as s:  # no write lock for a lookup
        row = token_store.find_token(s, token)
    if row is None:
        raise InvalidToken()
    if row.revoked_at is not None:
        raise InvalidToken((row.name, row.revoked_at))
    if token_store.needs_touch(row):  # at most once a minute per token
        with services.db.session() as s:
            token_store.touch_token(s, row.id)
    return Principal(row.scope, f"token:{row.id}", row.name)


# Where a client's token comes from, said in each refusal.
TOKEN_KINDS = "one of CKA_API_TOKENS, or one made with `cka-atlas token create`"


def _unauthorized(detail: str, *, invalid: bool = False) -> ProblemError:
    challenge = 'Bearer realm="cka-atlas"' + (', error="invalid_token"' if invalid else "")
    return ProblemError(
        401, "unauthorized", detail, field="Authorization", headers={"WWW-Authenticate": challenge}
    )


def _presented(request: Request, *, write: bool) -> str:
    """The bearer header's token, else the login cookie's (see COOKIE_NAME); each way of not
    presenting one is refused with its own sentence (401)."""
    header = request.headers.get("authorization", "").strip()
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":  # never echoed: the header may be the bare secret
            raise _unauthorized(
                "the Authorization header must read `Bearer <token>`; this one does not start "
                "with the word Bearer"
            )
        if not token.strip():
            raise _unauthorized("the Authorization header says Bearer but holds no token after it")
        return token.strip()
    cookie = request.cookies.get(COOKIE_NAME)
    if cookie and write and not request.headers.get(CSRF_HEADER):
        raise _unauthorized(
            f"the sign-in cookie authorises a write only with the {CSRF_HEADER} header, which "
            "this site's pages send; a script sends `Authorization: Bearer <token>` instead"
        )
    if cookie:
        return cookie
    services: Services = request.app.state.services
    with services.db.session(readonly=True) as s:
        locked = not services.settings.tokens and not token_store.active_tokens_exist(s)
    detail = (
        f"this request needs a bearer token ({TOKEN_KINDS}): send `Authorization: Bearer <token>`"
    )
    raise _unauthorized(f"{detail}; {token_store.LOCKED}" if locked else detail)


def _client_key(request: Request) -> str:
    return f"addr:{request.client.host if request.client else 'unknown'}"


def _check(request: Request, need: str) -> Principal:
    services: Services = request.app.state.services
    if not auth_required(services):
        return Principal("admin", _client_key(request), anonymous=True)
    token = _presented(request, write=need != "read")
    try:
        principal = authenticate(services, token)
    except InvalidToken as exc:
        if exc.revoked is None:
            raise _unauthorized(
                f"the bearer token is not known to this service: it is not {TOKEN_KINDS}",
                invalid=True,
            ) from None
        name, when = exc.revoked
        raise _unauthorized(
            f"the bearer token {name!r} was revoked at {when:%Y-%m-%d %H:%M} UTC; ask an admin "
            "for a new one",
            invalid=True,
        ) from None
    remember_caller(request, principal.name)
    if not token_store.scope_allows(principal.scope, need):
        raise ProblemError(
            403,
            "forbidden",
            f"this token has the {principal.scope} scope; this request needs {need} (ask an "
            f"admin for a token of scope {need})",
            field="Authorization",
        )
    return principal


def _limited(request: Request, principal: Principal) -> None:
    limiter = getattr(request.app.state, "write_limiter", None)
    if limiter is not None:
        limiter.hit(principal.key)


def limit_login(request: Request) -> None:
    """Count a ``POST /login`` against ``CKA_WRITE_RATE``, per client address (it takes
    guesses at tokens): the 429 problem past the rate."""
    limiter = getattr(request.app.state, "write_limiter", None)
    if limiter is not None:
        limiter.hit(f"login:{_client_key(request)}", "sign-ins")


def require_write(request: Request) -> Principal:
    """Dependency of every write endpoint: a write token, then the write rate limit."""
    principal = _check(request, "write")
    _limited(request, principal)
    return principal


def require_admin(request: Request) -> Principal:
    """Dependency of deletes and token management: an admin token, then the rate limit."""
    principal = _check(request, "admin")
    _limited(request, principal)
    return principal


def require_read(request: Request) -> None:
    """Dependency of every read endpoint: a token of any scope when CKA_READ_REQUIRES_TOKEN;
    otherwise a bearer token that comes along is only named in the access log (a wrong one is
    ignored, as no token would be)."""
    services: Services = request.app.state.services
    if services.settings.read_requires_token:
        _check(request, "read")
        return
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        with contextlib.suppress(InvalidToken):
            remember_caller(request, authenticate(services, token.strip()).name)


# What a route declares to say who may call it: ``@router.get(..., **READ)``.
READ: dict[str, Any] = {"dependencies": [Depends(require_read)]}
WRITE: dict[str, Any] = {"dependencies": [Depends(require_write)]}
ADMIN: dict[str, Any] = {"dependencies": [Depends(require_admin)]}  # deletes, tokens


# A JSON body is parsed whole into Python objects (several times its size) before any
# field is validated; the largest legitimate one (a comparison) is a few kilobytes.
JSON_BODY_LIMIT = 1024 * 1024


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return False


class BodyLimitMiddleware:
    """Answer 413 (problem+json) to request bodies over ``limit`` bytes (JSON: 1 MiB)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = min(self.limit, JSON_BODY_LIMIT) if _is_json(scope) else self.limit
        detail = f"the request body exceeds the limit of {limit} bytes"
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await problem_response(413, "payload_too_large", detail)(scope, receive, send)
                    return
        seen = 0
        exceeded = False
        replied = False

        async def limited_receive() -> Message:
            # Past the limit, pretend the client went away: the framework stops reading and
            # whatever it answers (an error) is replaced by the 413 below.
            nonlocal seen, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def reply_413() -> None:
            nonlocal replied
            if not replied:
                replied = True
                await problem_response(413, "payload_too_large", detail)(scope, receive, send)

        async def guarded_send(message: Message) -> None:
            if exceeded:
                await reply_413()
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded:
            await reply_413()


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _host_and_port(value: str, scheme: str) -> tuple[str, int | None]:
    """A Host header's name (lower case, IPv6 without brackets) and port (the default if none)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.partition(":")
    if not port:
        return name.rstrip("."), DEFAULT_PORTS.get(scheme)
    return name.rstrip("."), int(port) if port.isdigit() else None


def _origin(url: str) -> tuple[str, int | None] | None:
    """The (host, port) of an Origin or Referer URL; None if it names no http(s) origin."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.rstrip("."), port or DEFAULT_PORTS[parts.scheme]


class OriginMiddleware:
    """400 for a Host the service does not answer to; 403 for a cross-origin write.

    Same origin means the same host and port as the request's ``Host`` (the scheme is left
    out: behind a TLS proxy the service sees plain HTTP). ``Origin: null`` (a sandboxed or
    file page) is another origin.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.names = settings.host_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        scheme = scope.get("scheme", "http")
        host = headers.get("host")
        own = _host_and_port(host, scheme) if host is not None else None
        if own is not None and self.names is not None and own[0] not in self.names:
            detail = (
                f"this service does not answer to the host name {own[0][:100]!r}; an operator "
                "adds it to CKA_ALLOWED_HOSTS"
            )
            await problem_response(400, "invalid_host", detail)(scope, receive, send)
            return
        if scope["method"] in UNSAFE_METHODS:
            claimed = headers.get("origin") or headers.get("referer")
            if claimed is not None and (own is None or _origin(claimed) != own):
                detail = (
                    f"a write from another origin ({claimed[:100]}) is refused; use this "
                    "service's own pages or a client that is not a browser"
                )
                await problem_response(403, "cross_origin", detail)(scope, receive, send)
                return
        await self.app(scope, receive, send)
