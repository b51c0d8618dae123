"""Errors a user can cause: each carries one sentence that says what is wrong.

Imports nothing, so the service can name these classes (its schemas, its problem handlers)
without loading the libraries; :class:`AnalysisError` follows the rule
:class:`models.errors.InputError` states for :mod:`models`' own errors (a ``ValueError``, a
stable ``code``, no HTTP status) without deriving from it, since importing :mod:`models` loads
torch and timm.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "AnalysisError",
    "Cancelled",
    "DatasetError",
    "DatasetTooLarge",
    "EstimatorError",
    "LayerError",
    "OptionsError",
    "allowed_values",
    "closest",
    "did_you_mean",
]


def closest(value: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` names most like ``value`` (difflib's ratio, best first), if any is close."""
    return difflib.get_close_matches(value, list(names), n=n, cutoff=0.6)


def did_you_mean(value: object, names: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the name most like ``value``, or nothing: the end of a
    sentence that refuses an unknown name."""
    found = closest(str(value), names, n=1) if isinstance(value, str) else []
    return f"; did you mean {found[0]!r}?" if found else ""


class AnalysisError(ValueError):
    """Base of every user-facing error raised by :mod:`analysis`: an input it cannot use.

    ``code`` is a stable name for the kind of mistake, as for :class:`models.errors.InputError`;
    a service maps codes (or classes) to its own statuses.
    """

    code: ClassVar[str] = "invalid_input"


class DatasetError(AnalysisError):
    """A dataset could not be read or does not hold images of the expected form."""

    code = "invalid_dataset"


class DatasetTooLarge(DatasetError):
    """A dataset whose images, as float32, would take more bytes than allowed: decided from
    its headers, before any image is decoded."""

    code = "dataset_too_large"


class LayerError(AnalysisError):
    """A layer selection matched nothing, or a layer cannot be read from a model."""

    code = "invalid_layers"


class EstimatorError(AnalysisError):
    """An estimator, kernel or batch plan that cannot give a defined CKA."""

    code = "invalid_estimator"


class OptionsError(EstimatorError):
    """Options that cannot run; the message is one sentence that starts with the field name.

    ``field``: the option (dotted for a nested one); ``kind``: the error's type, one of
    :data:`analysis.options.ERROR_TYPES` or pydantic's own.
    """

    def __init__(self, field: str, kind: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.kind = kind

    @classmethod
    def from_validation(cls, exc: ValidationError) -> OptionsError:
        """The first error of ``exc`` as one sentence; how many others there were, if any.

        The options' own checks (:mod:`analysis.options`) carry their sentence whole, as the
        error's ``reason``; pydantic's own wording ("Input should be ...") gets the value."""
        errors = exc.errors(include_url=False)
        first = errors[0]
        field = ".".join(str(part) for part in first["loc"]) or "options"
        reason = first["msg"]
        if "reason" not in (first.get("ctx") or {}):
            reason = f"{reason[:1].lower()}{reason[1:]}, not {first['input']!r}"
            reason += did_you_mean(first["input"], allowed_values(first))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return cls(field, first["type"], f"{field}: {reason}{more}")


def allowed_values(error: Any) -> list[str]:
    """The values a pydantic error of a choice (``literal_error``, ``enum``) allows, read from
    its ``expected`` ("'a', 'b' or 'c'"); nothing for other errors."""
    if error.get("type") not in ("literal_error", "enum"):
        return []
    return re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))


class Cancelled(Exception):
    """A comparison was stopped between batches by its ``on_batch`` callback."""
