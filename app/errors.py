"""Exceptions that carry their problem code and HTTP status, and the lookup by class.

Every error a user can cause knows how it is reported: the service's own errors (their class,
or for :class:`ProblemError` the instance) hold a stable ``code`` and an HTTP ``status``. The
libraries' errors (:class:`analysis.AnalysisError`, :class:`models.ModelError`) carry only their
``code``: HTTP is the service's business, so :data:`LIBRARY_STATUSES` gives their status by
class, here and nowhere else. Imports nothing, not even the libraries: their error classes are
named by module and looked up in ``sys.modules`` (:func:`library_error`), since an error of a
library can only come from a loaded library, and loading :mod:`models` (torch, timm) takes
seconds that the server's start and a command that needs no model should not spend. Every
layer may import it.
"""

from __future__ import annotations

import sys
from typing import ClassVar

__all__ = ["LIBRARY_STATUSES", "AtlasError", "ProblemError", "library_error", "problem_of"]

# Every error of a library is an input the service cannot use: 422 Unprocessable Content. The
# classes by (module, name); each is a ValueError (the root the libraries' errors share).
LIBRARY_STATUSES: dict[tuple[str, str], int] = {
    ("analysis.errors", "AnalysisError"): 422,
    ("models.errors", "ModelError"): 422,
}


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


def library_error(exc: BaseException) -> int | None:
    """The HTTP status of a library's user-facing error (:data:`LIBRARY_STATUSES`), else None."""
    for (module, name), status in LIBRARY_STATUSES.items():
        kind = getattr(sys.modules.get(module), name, None)
        if kind is not None and isinstance(exc, kind):
            return status
    return None


def problem_of(exc: BaseException) -> tuple[int, str] | None:
    """``(status, code)`` of an error that carries them (ours or a library's), else None."""
    code, status = getattr(exc, "code", None), getattr(exc, "status", None)
    if not isinstance(code, str):
        return None
    if isinstance(status, int):
        return status, code
    library_status = library_error(exc)
    return None if library_status is None else (library_status, code)
