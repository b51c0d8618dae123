"""A test's deadline: the moment its waits share, so it fails saying what it waited for.

The ``deadline`` fixture (tests/conftest.py) sets it from pytest-timeout's limit, counted from
before the test's fixtures were set up, less a margin.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Deadline"]


@dataclass(frozen=True)
class Deadline:
    """A moment (``time.monotonic``) that a test's waits share."""

    at: float

    def left(self, at_most: float | None = None) -> float:
        """Seconds to the deadline (at least 1; at most ``at_most``)."""
        left = max(self.at - time.monotonic(), 1.0)
        return left if at_most is None else min(left, at_most)
