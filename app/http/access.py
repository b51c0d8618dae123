"""What every response carries, and who its access-log line names.

:class:`ResponseMiddleware` wraps the whole app: each response gets
``X-Content-Type-Options: nosniff`` (a browser never guesses an API body, an upload's name or
a heatmap to be HTML or script), and as it starts, the name of the token the request was
authorised with — recorded by :func:`remember_caller` wherever a token is accepted (the API's
scopes, the pages' cookie) — is handed to the access log (:func:`app.logs.set_access_caller`),
which uvicorn writes in the same context. The token itself never is.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.logs import set_access_caller

__all__ = ["ResponseMiddleware", "remember_caller"]

_CALLER = "cka_caller"  # the key in the request's state (the ASGI scope's "state")


def remember_caller(request: Request, name: str | None) -> None:
    """The request was authorised with the token called ``name``: its access-log line says so."""
    request.state.cka_caller = name


class ResponseMiddleware:
    """``nosniff`` on every response; the caller's token name for the access log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})  # shared with every Request made of this scope

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-content-type-options" for k, _ in headers):
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
                set_access_caller(state.get(_CALLER))
            await send(message)

        await self.app(scope, receive, send_with_headers)
