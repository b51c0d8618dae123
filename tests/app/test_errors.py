"""The libraries' errors carry a code and no HTTP status; the service gives their status."""

from __future__ import annotations

import pytest

import analysis
import models
from analysis.studies import StudyError
from app.errors import ProblemError, problem_of
from app.store.artifacts import StoreError


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (models.ModelError("x"), "invalid_input"),
        (models.ConfigError("x"), "invalid_config"),
        (models.CheckpointError("x"), "invalid_checkpoint"),
        (analysis.AnalysisError("x"), "invalid_input"),
        (analysis.DatasetError("x"), "invalid_dataset"),
        (analysis.LayerError("x"), "invalid_layers"),
        (StudyError("x"), StudyError.code),
    ],
)
def test_a_library_error_is_unprocessable_input(error: Exception, code: str) -> None:
    assert not hasattr(error, "status")  # HTTP is the service's business
    assert problem_of(error) == (422, code)


def test_service_errors_keep_their_own_status() -> None:
    assert problem_of(ProblemError(409, "conflict", "taken")) == (409, "conflict")
    assert problem_of(StoreError("full")) == (503, "storage_error")
    assert problem_of(ValueError("plain")) is None
