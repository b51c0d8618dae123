"""Errors a user can cause: each carries one sentence that says what is wrong.

:class:`InputError` is the root both libraries share: :class:`ModelError` is :mod:`models`' base,
and :mod:`analysis` (the upper library) derives its own base from the same root, so the meaning
of ``code`` and the rule that a library knows no HTTP are written here once.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["CheckpointError", "ConfigError", "InputError", "ModelError", "TrainingCancelled"]


class InputError(ValueError):
    """An input a library cannot use: the root of each library's user-facing errors.

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
