"""Errors a user can cause: each carries one sentence that says what is wrong."""

from __future__ import annotations

__all__ = ["AnalysisError", "Cancelled", "DatasetError", "EstimatorError", "LayerError"]


class AnalysisError(ValueError):
    """Base of every user-facing error raised by :mod:`analysis`."""


class DatasetError(AnalysisError):
    """A dataset could not be read or does not hold images of the expected form."""


class LayerError(AnalysisError):
    """A layer selection matched nothing, or a layer cannot be read from a model."""


class EstimatorError(AnalysisError):
    """An estimator, kernel or batch plan that cannot give a defined CKA."""


class Cancelled(Exception):
    """A comparison was stopped between batches by its ``on_batch`` callback."""
