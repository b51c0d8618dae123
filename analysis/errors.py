"""Errors a user can cause: each carries one sentence that says what is wrong."""

from __future__ import annotations

from models.errors import InputError

__all__ = [
    "AnalysisError",
    "Cancelled",
    "DatasetError",
    "DatasetTooLarge",
    "EstimatorError",
    "LayerError",
]


class AnalysisError(InputError):
    """Base of every user-facing error raised by :mod:`analysis`.

    Its root, :class:`models.errors.InputError`, is the one :mod:`models` (the lower library)
    defines for its own errors: a stable ``code`` per kind of mistake and no HTTP status.
    """


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


class Cancelled(Exception):
    """A comparison was stopped between batches by its ``on_batch`` callback."""
