"""Exceptions that carry their problem code and HTTP status, and the lookup by class.

Every error a user can cause knows how it is reported: its class (or, for
:class:`ProblemError`, the instance) holds a stable ``code`` and an HTTP ``status``. The
libraries' errors (:class:`analysis.AnalysisError`, :class:`models.ModelError`) carry the same
two attributes, so :func:`problem_of` maps any of them by class, never by name. Imports
nothing from :mod:`app`; every layer may import it.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["AtlasError", "ProblemError", "problem_of"]


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
    if isinstance(code, str) and isinstance(status, int):
        return status, code
    return None
