"""Bearer tokens for writes (and optionally reads), the upload size limit, model options.

Tokens come from ``CKA_API_TOKENS``; with none configured writes are open (a laptop
default). Comparison is constant-time. The body limit is enforced while the request body
streams in, before multipart parsing spools anything to disk: a declared
``Content-Length`` over the limit is refused at once, and a chunked body is cut off as
soon as it crosses the limit.

A checkpoint's architecture options (the sidecar's ``config``, or the ``config`` form field
of a timm upload) become keyword arguments of ``timm.create_model``. Those that make timm
fetch or read weights of its own (``pretrained``, ``checkpoint_path``, ``pretrained_cfg*``,
``cache_dir``) would let a writer make the server request any URL or open any local file,
so :func:`refuse_loader_options` rejects them before any model is built.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.problems import ProblemError, problem_response

__all__ = [
    "COOKIE_NAME",
    "CSRF_HEADER",
    "BodyLimitMiddleware",
    "require_read",
    "require_write",
    "token_valid",
]


_FIELD = "Authorization"


# The web page's login sets this HttpOnly, SameSite=Strict cookie holding the token. It
# authorises reads; it authorises a write only together with CSRF_HEADER, a custom header
# that a cross-site form cannot send (and cross-origin scripts cannot without CORS).
COOKIE_NAME = "cka_token"
CSRF_HEADER = "x-cka-csrf"


def token_valid(tokens: frozenset[str], token: str) -> bool:
    """Whether ``token`` is one of ``tokens`` (constant-time per candidate)."""
    return bool(token) and any(hmac.compare_digest(token.encode(), t.encode()) for t in tokens)


def _presented(request: Request, *, write: bool) -> str | None:
    """The bearer header's token, else the login cookie's (see COOKIE_NAME), else None."""
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    cookie = request.cookies.get(COOKIE_NAME)
    if cookie and (not write or request.headers.get(CSRF_HEADER)):
        return cookie
    return None


def _check(request: Request, *, write: bool) -> None:
    tokens: frozenset[str] = request.app.state.services.settings.tokens
    token = _presented(request, write=write)
    if not token:
        raise ProblemError(
            401,
            "unauthorized",
            "a bearer token is required",
            field="Authorization",
            headers={"WWW-Authenticate": 'Bearer realm="cka-atlas"'},
        )
    if not token_valid(tokens, token):
        raise ProblemError(
            401,
            "unauthorized",
            "the bearer token is not valid",
            field="Authorization",
            headers={"WWW-Authenticate": 'Bearer realm="cka-atlas", error="invalid_token"'},
        )


def require_write(request: Request) -> None:
    """Dependency of every write endpoint."""
    if request.app.state.services.settings.tokens:
        _check(request, write=True)


def require_read(request: Request) -> None:
    """Dependency of every read endpoint (a no-op unless CKA_READ_REQUIRES_TOKEN)."""
    settings = request.app.state.services.settings
    if settings.read_requires_token and settings.tokens:
        _check(request, write=False)


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
