"""Logs: one JSON object per line stamped with the job being run, or plain lines on a terminal.

A worker wraps each job in :func:`job_context`; every record logged inside it (by this
thread, or by tasks that copied its context) carries ``job_id`` and ``job_kind``, so
``grep '"job_id": 42'`` or a log pipeline's filter shows one job's whole story across the
API, the embedded worker and Celery workers. :func:`configure_logging` installs the
formatter on the root logger (``CKA_LOG_FORMAT``: json, text, or auto, which is text on a
terminal); :func:`uvicorn_log_config` gives uvicorn the same JSON format.

The access log (uvicorn's, one line per request) passes :class:`AccessLogFilter`: the value of
any query parameter that looks like a secret (``?token=…``, which the service never accepts
but a client may send) is replaced before the line is written, and the name of the token the
request was authorised with (never the token) is added, as ``token_name`` and at the end of
the line: the audit trail of who did what. The HTTP layer says who asked
(:func:`set_access_caller`) as the response starts, in the context uvicorn logs it from.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "AccessLogFilter",
    "JsonFormatter",
    "configure_logging",
    "current_job",
    "job_context",
    "redact_query",
    "resolved_format",
    "set_access_caller",
    "uvicorn_log_config",
]

_job: ContextVar[tuple[int, str] | None] = ContextVar("cka_job", default=None)
# The name of the token the request being answered was authorised with (None: no token).
_caller: ContextVar[str | None] = ContextVar("cka_caller", default=None)
# A query parameter whose name says it holds a secret: its value never reaches a log.
_SECRET_PARAM = re.compile(
    r"(?P<name>(?:^|[?&])[^=&#]*(?:token|secret|password|passwd|api[_-]?key|auth)[^=&#]*=)"
    r"[^&#]*",
    re.IGNORECASE,
)

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is kept.
# ``color_message`` is uvicorn's ANSI-coloured copy of the message: noise in a JSON line.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName", "color_message"}
)


def current_job() -> tuple[int, str] | None:
    """``(job id, kind)`` of the job running in this context, or None."""
    return _job.get()


@contextmanager
def job_context(job_id: int, kind: str) -> Iterator[None]:
    """Stamp every record logged inside the block with this job's id and kind."""
    token = _job.set((int(job_id), str(kind)))
    try:
        yield
    finally:
        _job.reset(token)


def set_access_caller(name: str | None) -> None:
    """Name the token the current request was authorised with, for its access-log line."""
    _caller.set(name)


def redact_query(path: str) -> str:
    """``path`` (with its query) with the value of every secret-looking parameter replaced."""
    if "?" not in path:
        return path
    base, _, query = path.partition("?")
    return f"{base}?{_SECRET_PARAM.sub(lambda m: m['name'] + '[redacted]', query)}"


class AccessLogFilter(logging.Filter):
    """Installed on uvicorn's access logger: secrets out of the path, the token's name in."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_access_filtered", False):  # installed twice (dictConfig adds)
            return True
        record._access_filtered = True
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:  # client, method, path, version, status
            record.args = (args[0], args[1], redact_query(str(args[2])), args[3], args[4])
        name = _caller.get()
        if name is not None:
            record.token_name = name
            said = repr(name).replace("%", "%%")  # the name is text, not a format
            record.msg = f"{record.msg} (token {said})"
        return True


# A plain line: time, level, logger, message.
TEXT_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """Format a record as one line of JSON: time, level, logger, message, job, extras."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        job = getattr(record, "job_id", None)
        if job is None and (current := current_job()) is not None:
            doc["job_id"], doc["job_kind"] = current
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in doc:
                doc[key] = _jsonable(value)
        if record.exc_info and record.exc_info[0] is not None:
            doc["exc_type"] = record.exc_info[0].__name__
            doc["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(doc, ensure_ascii=False)


def resolved_format(fmt: str = "auto") -> str:
    """``json`` or ``text``: ``auto`` (``CKA_LOG_FORMAT``'s default) is plain text when stderr
    is a terminal, JSON otherwise (a container, a file, a log pipeline)."""
    if fmt == "auto":
        return "text" if sys.stderr.isatty() else "json"
    return fmt


def configure_logging(level: str = "info", *, fmt: str = "auto") -> None:
    """Send every logger's records to stderr, as JSON lines or plain text (see
    :func:`resolved_format`).

    Alembic's own lines (its dialect, one "Running upgrade" per revision) are left out below
    warnings: :func:`app.store.db.upgrade` logs one line per revision it runs.
    """
    handler = logging.StreamHandler(sys.stderr)
    if resolved_format(fmt) == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TEXT_FORMAT)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("alembic").setLevel(max(root.level, logging.WARNING))
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, AccessLogFilter) for f in access.filters):
        access.addFilter(AccessLogFilter())


def uvicorn_log_config(level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for ``uvicorn.run(log_config=...)`` in the same JSON."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "filters": {"access": {"()": AccessLogFilter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            name: {
                "handlers": ["stderr"],
                "level": level.upper(),
                "propagate": False,
                **({"filters": ["access"]} if name == "uvicorn.access" else {}),
            }
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
    }
