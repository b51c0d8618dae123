"""The one schema of a checkpoint sidecar, checked when a sidecar is read and when one is uploaded.

:func:`models.save` writes a sidecar; :func:`models.read_sidecar` (so :func:`models.load`) and a
service accepting an upload check it here. The known fields have types a reader can rely on —
``metrics.test.accuracy`` is a number in [0, 1], ``preprocessing`` a pipeline with one mean and
a positive std per channel, ``config`` the options of the architecture (a preset's options
validated against its family's schema) — and unknown fields are kept as they are. Every
refusal is a :class:`CheckpointError` of one sentence naming the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from models.errors import CheckpointError, ConfigError
from models.families import family_of
from models.options import validate_config
from models.preprocessing import MAX_MEAN, STD_RANGE
from models.preprocessing import validate as validate_pipeline

__all__ = ["Sidecar", "check_sidecar"]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Number = Annotated[float, AfterValidator(_finite)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class DatasetIdentity(_Strict):
    """Which data a model saw: its name and the sha256 of its content."""

    name: str = Field(max_length=1000)
    sha256: str = Field(max_length=128)


class SplitMetrics(_Strict):
    """Metrics of one split (``train``, ``test``): numbers where a reader computes with them."""

    accuracy: Annotated[Number, Field(ge=0.0, le=1.0)] | None = None
    loss: float | None = None  # a diverged run's NaN is still a loss
    n: Annotated[int, Field(ge=0)] | None = None
    dataset: DatasetIdentity | None = None


class Normalisation(_Strict):
    """The per-channel normalisation, within the bounds of a pipeline's (models.preprocessing)."""

    mean: list[Annotated[Number, Field(ge=-MAX_MEAN, le=MAX_MEAN)]]
    std: list[Annotated[Number, Field(ge=STD_RANGE[0], le=STD_RANGE[1])]]


class Sidecar(_Strict):
    """The fields of a sidecar that readers use; others are kept unchecked."""

    format: str
    format_version: Annotated[int, Field(ge=1)]
    arch: str = Field(max_length=200)
    config: dict[str, Any]
    input_shape: list[Annotated[int, Field(ge=1)]] = Field(min_length=3, max_length=3)
    num_classes: Annotated[int, Field(ge=0)]
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    family: str | None = None
    preset: str | None = None
    name: str | None = Field(default=None, max_length=1000)
    parameters: Annotated[int, Field(ge=0)] | None = None
    free_parameters: Annotated[int, Field(ge=0)] | None = None
    connections: Annotated[int, Field(ge=0)] | None = None
    effective_width: Annotated[int, Field(ge=0)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    dataset: DatasetIdentity | None = None
    metrics: dict[str, SplitMetrics] = Field(default_factory=dict)
    normalisation: Normalisation | None = None
    preprocessing: dict[str, Any] | None = None
    training: dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("preprocessing")
    @classmethod
    def _pipeline(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        try:
            return validate_pipeline(value, "the pipeline")
        except CheckpointError as exc:
            raise ValueError(str(exc)) from None


def _sentence(source: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "?"
    message = error["msg"][:1].lower() + error["msg"][1:]
    message = message.removeprefix("value error, ")
    got = repr(error["input"])
    got = got if len(got) <= 80 else got[:77] + "..."
    return f"{source}: field '{where}': {message} (got {got})"


def check_sidecar(document: dict[str, Any], *, source: str = "sidecar") -> dict[str, Any]:
    """``document`` if it fits :class:`Sidecar` and a preset's options validate; else a sentence."""
    try:
        Sidecar.model_validate(document)
    except ValidationError as exc:
        raise CheckpointError(_sentence(source, exc)) from None
    if family_of(document["arch"]) is not None:
        try:
            validate_config(document["arch"], document["config"])
        except ConfigError as exc:
            raise CheckpointError(f"{source}: field 'config': {exc}") from exc
    return document
