"""Errors a user can cause: each carries one sentence that says what is wrong.

:class:`InputError` states the rule for a library's errors — a ``ValueError`` with a stable
``code`` and no HTTP status — and is :class:`ModelError`'s root. :class:`analysis.AnalysisError`
follows the same rule without deriving from it: :mod:`analysis.errors` imports nothing, so a
service can name the analysis errors without importing this package (which loads torch and timm).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["CheckpointError", "ConfigError", "InputError", "ModelError", "TrainingCancelled"]


class InputError(ValueError):
    """An input a library cannot use: the root of :mod:`models`' user-facing errors.

    ``code`` is a stable name for the kind of mistake; the libraries know nothing of HTTP, so
    a service maps codes (or classes) to its own statuses.
    """

    code: ClassVar[str] = "invalid_input"


class ModelError(InputError):
    """Base of every user-facing error raised by :mod:`models`."""


class ConfigError(ModelError):
    """An unknown architecture, an unknown option, or options that do not fit together."""

    code = "invalid_config"


class CheckpointError(ModelError):
    """A checkpoint that cannot be read, does not match its sidecar, or does not fit its model."""

    code = "invalid_checkpoint"


class TrainingCancelled(Exception):
    """A training stopped early because its ``on_step`` callback returned False.

    Not a :class:`ModelError`: nothing about the input was wrong. No checkpoint is written.
    """
