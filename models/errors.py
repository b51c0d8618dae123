"""Errors a user can cause: each carries one sentence that says what is wrong."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["CheckpointError", "ConfigError", "ModelError", "TrainingCancelled"]


class ModelError(ValueError):
    """Base of every user-facing error raised by :mod:`models`.

    ``code`` is a stable name for the kind of mistake; the library knows nothing of HTTP, so
    a service maps codes (or classes) to its own statuses.
    """

    code: ClassVar[str] = "invalid_input"


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
