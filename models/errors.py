"""Errors a user can cause: each carries one sentence that says what is wrong."""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "ModelError"]


class ModelError(ValueError):
    """Base of every user-facing error raised by :mod:`models`."""


class ConfigError(ModelError):
    """An unknown architecture, an unknown option, or options that do not fit together."""


class CheckpointError(ModelError):
    """A checkpoint that cannot be read, does not match its sidecar, or does not fit its model."""
