"""Fixtures for the analysis tests: the independent reference CKA (tests/analysis/reference.py)."""

from __future__ import annotations

import types

import pytest

from tests.analysis import reference


@pytest.fixture
def ref() -> types.SimpleNamespace:
    """The reference implementation, for tests to compare the engine against."""
    return types.SimpleNamespace(
        gram=reference.gram,
        hsic=reference.hsic,
        batches=reference.batches,
        cka=reference.cka,
        cka_matrix=reference.cka_matrix,
    )
