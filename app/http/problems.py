"""RFC 9457 ``application/problem+json`` errors with a stable ``code`` and offending ``field``.

Every error the API returns goes through here, including FastAPI's validation errors and
Starlette's 404/405, so a client only ever parses one error shape. Every error a user can
cause carries its own code, and :mod:`app.errors` gives its status, so one handler maps them.
A part the service needs being away (the database, the broker) is 503 with ``Retry-After``:
the client retries later, and only a bug answers 500.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerError
from pydantic import BaseModel, Field
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeout
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from analysis.errors import allowed_values, did_you_mean
from analysis.options import ERROR_TYPES as OPTION_ERRORS
from app.errors import AtlasError, ProblemError, problem_of
from app.store.artifacts import StoreError
from app.store.db import is_transient

__all__ = [
    "PROBLEM_RESPONSES",
    "RETRY_AFTER_S",
    "Problem",
    "ProblemError",
    "install_problem_handlers",
    "problem_response",
    "unavailable",
]

log = logging.getLogger(__name__)
MEDIA_TYPE = "application/problem+json"

# Every error class whose problem code and status app.errors knows. The libraries' errors are
# ValueErrors (app.errors.LIBRARY_STATUSES names their classes without importing the libraries):
# a ValueError that is none of theirs is answered as the unexpected error it is.
CODED_ERRORS: tuple[type[Exception], ...] = (AtlasError, ValueError, StoreError)

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}

# Seconds a client is told to wait when the database or the broker is away (a restart, a
# lost connection): long enough not to hammer it, short enough to notice it is back.
RETRY_AFTER_S = 5
DATABASE_ERRORS: tuple[type[Exception], ...] = (DBAPIError, PoolTimeout)
BROKER_ERRORS: tuple[type[Exception], ...] = (BrokerError, RedisConnectionError, RedisTimeout)


class Problem(BaseModel):
    """The body of every error response."""

    type: str = Field("about:blank", examples=["about:blank"])
    title: str = Field(examples=["Not Found"])
    status: int = Field(examples=[404])
    detail: str = Field(examples=["model 42 does not exist"])
    code: str = Field(description="Stable machine-readable error code.", examples=["not_found"])
    field: str | None = Field(None, description="The offending input field, dotted.")
    errors: list[dict[str, Any]] | None = Field(None, description="Every validation error.")


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    field: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _title(status),
        "status": status,
        "detail": detail,
        "code": code,
        "field": field,
    }
    if errors is not None:
        body["errors"] = errors
    # also on the 500 that Starlette's outermost error handler sends past every middleware
    headers = {"X-Content-Type-Options": "nosniff", **(headers or {})}
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _loc_field(loc: tuple[Any, ...] | list[Any]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form")]
    return ".".join(parts) or None


def _json_safe(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)


def install_problem_handlers(app: FastAPI) -> None:
    """Route every error, ours and the framework's, through :func:`problem_response`."""

    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(
            exc.status, exc.code, exc.detail, field=exc.field, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": _loc_field(e.get("loc", ())), "message": e.get("msg", ""), "type": e["type"]}
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"field": None, "message": "invalid request"}
        message = str(first["message"])
        if choices := allowed_values(exc.errors()[0]):  # an unknown value of a choice
            given = exc.errors()[0].get("input")
            message += f", not {given!r}{did_you_mean(given, choices)}"
        detail = f"{first['field']}: {message}" if first["field"] else message
        # A comparison option's own check (batch too small for the estimator, an interval in
        # full mode, …) has its type as its code, as when analysis.CompareOptions raises it.
        code = first.get("type") if first.get("type") in OPTION_ERRORS else "validation_error"
        return problem_response(
            422, str(code), detail, field=first["field"], errors=_json_safe(errors)
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        return problem_response(
            exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None)
        )

    async def _coded(request: Request, exc: Exception) -> JSONResponse:
        problem = problem_of(exc)
        if problem is None and isinstance(exc, ValueError):  # not a library's: a bug
            return await _unexpected(request, exc)
        status, code = problem or (500, "internal_error")
        return problem_response(status, code, str(exc))

    # Our errors and the libraries' carry their code and status (app.errors). They are
    # registered by class, not caught as Exception: Starlette treats an Exception handler as
    # the last resort for a crashed request, and re-raises the error after answering.
    for coded in CODED_ERRORS:
        app.add_exception_handler(coded, _coded)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(500, "internal_error", "internal error; see the server log")

    async def _part_away(request: Request, exc: Exception) -> JSONResponse:
        answer = unavailable(exc)
        if answer is None:  # a database error that is not an outage (a constraint, a bug)
            return await _unexpected(request, exc)
        code, detail = answer
        log.warning(
            "%s %s answered 503: %s (%s)",
            request.method,
            request.url.path,
            detail,
            _first_line(exc),
        )
        return problem_response(503, code, detail, headers={"Retry-After": str(RETRY_AFTER_S)})

    for away in (*DATABASE_ERRORS, *BROKER_ERRORS):
        app.add_exception_handler(away, _part_away)


def unavailable(exc: BaseException) -> tuple[str, str] | None:
    """``(code, sentence)`` of an error that means a part is away, else None."""
    if isinstance(exc, DATABASE_ERRORS) and is_transient(exc):
        return (
            "database_unavailable",
            f"the database cannot be reached right now; retry in {RETRY_AFTER_S} seconds",
        )
    if isinstance(exc, BROKER_ERRORS):
        return (
            "broker_unavailable",
            f"the job queue (broker) cannot be reached right now; retry in {RETRY_AFTER_S} seconds",
        )
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _problem_doc(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description, "content": {MEDIA_TYPE: {}}}


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _problem_doc("The request body cannot be parsed (e.g. JSON that is not UTF-8)."),
    401: _problem_doc("Missing or wrong bearer token."),
    404: _problem_doc("No such resource."),
    409: _problem_doc("The request conflicts with the current state."),
    413: _problem_doc("The upload exceeds CKA_MAX_UPLOAD_BYTES."),
    422: _problem_doc("Invalid input; `field` names the offending field."),
    503: _problem_doc(
        "The database or the job queue is away for now (`database_unavailable`, "
        "`broker_unavailable`: retry after `Retry-After` seconds), or the artifact store "
        "cannot be written (`storage_error`)."
    ),
    507: _problem_doc("The artifact store is full (`storage_error`)."),
}
