"""Exceptions that carry their problem code and HTTP status, and the lookup by class.

Every error a user can cause knows how it is reported: the service's own errors (their class,
or for :class:`ProblemError` the instance) hold a stable ``code`` and an HTTP ``status``. The
libraries' errors (:class:`analysis.AnalysisError`, :class:`models.ModelError`) carry only their
``code``: HTTP is the service's business, so :data:`LIBRARY_STATUSES` gives their status by
class, here and nowhere else. Imports nothing from :mod:`app` (only the libraries beneath it);
every layer may import it.
"""

from __future__ import annotations

from typing import ClassVar

from analysis import AnalysisError
from models import ModelError

__all__ = ["LIBRARY_STATUSES", "AtlasError", "ProblemError", "problem_of"]

# Every error of a library is an input the service cannot use: 422 Unprocessable Content.
LIBRARY_STATUSES: dict[type[Exception], int] = {AnalysisError: 422, ModelError: 422}


class AtlasError(Exception):
    """Base of the service's own errors; subclasses set ``code`` and ``status``."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500


class ProblemError(AtlasError):
    """An error answered with a problem document whose code and status are chosen here."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        field: str | None = None,
        title: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status  # type: ignore[misc]  # per instance, unlike the class default
        self.code = code  # type: ignore[misc]
        self.detail = detail
        self.field = field
        self.title = title
        self.headers = headers


def problem_of(exc: BaseException) -> tuple[int, str] | None:
    """``(status, code)`` of an error that carries them (ours or a library's), else None."""
    code, status = getattr(exc, "code", None), getattr(exc, "status", None)
    if not isinstance(code, str):
        return None
    if isinstance(status, int):
        return status, code
    for kind, library_status in LIBRARY_STATUSES.items():
        if isinstance(exc, kind):
            return library_status, code
    return None
