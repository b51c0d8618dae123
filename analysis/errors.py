"""Errors a user can cause: each carries one sentence that says what is wrong."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["AnalysisError", "Cancelled", "DatasetError", "EstimatorError", "LayerError"]


class AnalysisError(ValueError):
    """Base of every user-facing error raised by :mod:`analysis`.

    ``code`` is a stable name for the kind of mistake; the library knows nothing of HTTP, so
    a service maps codes (or classes) to its own statuses.
    """

    code: ClassVar[str] = "invalid_input"


class DatasetError(AnalysisError):
    """A dataset could not be read or does not hold images of the expected form."""

    code = "invalid_dataset"


class LayerError(AnalysisError):
    """A layer selection matched nothing, or a layer cannot be read from a model."""

    code = "invalid_layers"


class EstimatorError(AnalysisError):
    """An estimator, kernel or batch plan that cannot give a defined CKA."""

    code = "invalid_estimator"


class Cancelled(Exception):
    """A comparison was stopped between batches by its ``on_batch`` callback."""
