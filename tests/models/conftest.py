"""Fixtures for the models tests: small inputs and a fixed seed."""

from __future__ import annotations

import pytest
import torch

import models


@pytest.fixture
def digits_batch() -> torch.Tensor:
    """Four random 8×8 single-channel images in [0, 1]."""
    return torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="session")
def digits_presets() -> list[str]:
    return [name for name in models.list_presets() if name.endswith("_digits")]
