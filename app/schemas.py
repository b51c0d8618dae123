"""Request and response bodies of the REST API, with the examples shown in OpenAPI."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

__all__ = [
    "ID_MAX",
    "NO_NUL",
    "ArchitectureOut",
    "ComparisonIn",
    "ComparisonOut",
    "DatasetOut",
    "Estimator",
    "Feature",
    "Kernel",
    "MatrixOut",
    "Mode",
    "ModelOut",
    "Page",
    "TrainingIn",
    "TrainingOut",
    "clean_name",
]

T = TypeVar("T")
# Row ids are 32-bit INTEGER keys (PostgreSQL ``integer``): a larger number cannot name a row
# and would overflow the column, so ids outside 1..ID_MAX are refused as invalid input.
ID_MAX = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=ID_MAX)]


def _utc(value: datetime) -> datetime:
    """Naive datetimes from the database are UTC; say so, so the JSON is RFC 3339."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


Timestamp = Annotated[datetime, AfterValidator(_utc)]


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("must not contain NUL (\\x00) characters")
    return value


# Text that may reach a database column: PostgreSQL's text types cannot hold NUL, so it is
# refused here, naming the field (constrained strings also refuse unpaired surrogates).
NO_NUL = AfterValidator(_no_nul)
Text = Annotated[str, StringConstraints(max_length=200), NO_NUL]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def clean_name(value: str, limit: int = 200) -> str:
    """A name taken from a file (an upload's filename, a sidecar's "name") made storable.

    Control characters (NUL among them) are dropped and unpaired surrogates replaced, so the
    text fits any database's text column; it is cut to ``limit`` characters.
    """
    text = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("", text)[:limit]


# "linear", "rbf" (median heuristic) or "rbf:T" (bandwidth T × median distance).
Kernel = Annotated[str, StringConstraints(pattern=r"^(linear|rbf(:[0-9.eE+-]{1,20})?)$")]
Estimator = Literal["unbiased", "biased"]
Mode = Literal["minibatch", "full"]
Feature = Literal["flatten", "mean_tokens"]
# A layer name or glob, or an index into the default layers (negative counts from the end);
# an index is a JSON integer, never a boolean.
LayerName = Annotated[str, StringConstraints(max_length=200), NO_NUL]
LayerIndex = Annotated[int, Field(strict=True, ge=-10_000, le=10_000)]
MAX_MODELS = 32
MAX_BATCH = 8192
MAX_LAYER_ITEMS = 200
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class Page(BaseModel, Generic[T]):
    """One page of a list; ask for the next with ``offset=offset+limit`` while < total."""

    items: list[T]
    total: int = Field(examples=[42])
    limit: int = Field(examples=[50])
    offset: int = Field(examples=[0])


class ArchitectureOut(BaseModel):
    name: str = Field(examples=["mixer_digits"])
    family: Literal["preset", "timm"] = Field(examples=["preset"])
    input_shape: list[int] | None = Field(default=None, examples=[[1, 8, 8]])
    num_classes: int | None = Field(default=None, examples=[10])
    default_layers: list[str] | None = Field(
        default=None, examples=[["blocks.0", "blocks.1", "norm"]]
    )


class ModelOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(examples=[1])
    name: str = Field(examples=["mixer_digits"])
    arch: str = Field(examples=["mixer_digits"])
    source: str = Field(examples=["upload"], description="upload, timm, training or zoo")
    sha256: str = Field(examples=["9f2c…"], description="sha256 of the safetensors file")
    size_bytes: int = Field(examples=[81234])
    config: dict[str, Any] = Field(examples=[{"depth": 4, "hidden_dim": 32}])
    input_shape: list[int] = Field(examples=[[1, 8, 8]])
    num_classes: int | None = Field(default=None, examples=[10])
    parameters: int = Field(examples=[20330])
    connections: int | None = Field(
        default=None, description="Ω, weights in the token/channel maps"
    )
    default_layers: list[str] = Field(examples=[["blocks.0", "blocks.1", "norm"]])
    sidecar: dict[str, Any] = Field(description="The checkpoint's JSON sidecar (metrics, data)")
    created_at: Timestamp


class DatasetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(examples=[1])
    name: str = Field(examples=["digits"])
    builtin: bool = Field(examples=[True])
    split: str = Field(examples=["test"])
    sha256: str = Field(description="Content hash of the decoded images and labels")
    n: int = Field(examples=[360])
    shape: list[int] = Field(examples=[[1, 8, 8]], description="(C, H, W)")
    classes: list[str] | None = Field(default=None, examples=[["0", "1", "2"]])
    size_bytes: int = Field(examples=[0])
    created_at: Timestamp


class JobFields(BaseModel):
    status: JobStatus = Field(examples=["running"])
    progress: float = Field(ge=0, le=1, examples=[0.4])
    eta_s: float | None = Field(default=None, description="Seconds left, from the rate so far")
    error: str | None = Field(default=None, examples=[None])
    error_code: str | None = Field(default=None, examples=[None])
    attempts: int = Field(examples=[1])
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None


class TrainingIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"arch": "mixer_digits", "dataset_id": 1, "epochs": 5, "seed": 0}]
        },
    )

    arch: Text = Field(min_length=1, description="A preset or timm name")
    dataset_id: Id
    epochs: int = Field(default=5, ge=1, le=1000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    batch_size: int | None = Field(default=None, ge=1, le=8192, description="Default: the recipe's")
    lr: float | None = Field(default=None, gt=0, le=10, description="Default: the recipe's")
    name: Text | None = Field(default=None, description="Name of the resulting model")


class TrainingOut(JobFields):
    id: int = Field(examples=[1])
    arch: str = Field(examples=["mixer_digits"])
    dataset_id: int = Field(examples=[1])
    params: dict[str, Any]
    model_id: int | None = Field(default=None, description="The registered model once succeeded")
    created_at: Timestamp


class ComparisonIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model_ids": [1, 2],
                    "dataset_id": 1,
                    "layers": None,
                    "kernel": "linear",
                    "estimator": "unbiased",
                    "mode": "minibatch",
                    "batch_size": 128,
                    "feature": "flatten",
                    "bootstrap": 0,
                }
            ]
        },
    )

    model_ids: list[Id] = Field(
        min_length=1, max_length=MAX_MODELS, description="One or more models"
    )
    dataset_id: Id
    # The length limits sit on each member of the union: a bare max_length on the field
    # would also be applied to an integer selection and fail inside pydantic.
    layers: (
        LayerName
        | LayerIndex
        | Annotated[list[LayerName | LayerIndex], Field(max_length=MAX_LAYER_ITEMS)]
        | None
    ) = Field(
        default=None,
        description="Layer selection applied to every model: null for the default layers, "
        "a name, a glob such as `blocks.*` (`**` crosses dots), an index into the default "
        "layers (negative counts from the end), or a list of these.",
        examples=[None, "blocks.*", ["blocks.0", "norm"]],
    )
    kernel: Kernel = Field(default="linear", description="`linear`, `rbf` or `rbf:T`")
    estimator: Estimator = "unbiased"
    mode: Mode = "minibatch"
    batch_size: int = Field(
        default=256, ge=2, le=MAX_BATCH, description="≥ 4 for the unbiased estimator"
    )
    feature: Feature = "flatten"
    bootstrap: int = Field(default=0, ge=0, le=1000)
    force: bool = Field(
        default=False, description="Recompute even if an identical comparison exists"
    )

    @field_validator("layers", mode="wrap")
    @classmethod
    def _one_layers_error(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # A union reports one error per member, located at pydantic's internal member tags
        # ("layers.constrained-str"); answer with one sentence located at "layers" instead.
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(
                "layers must be null, a layer name or glob of at most 200 characters, an "
                f"integer index, or a list of at most {MAX_LAYER_ITEMS} of these"
            ) from None


class ComparisonModelOut(BaseModel):
    id: int
    label: str


class ComparisonOut(JobFields):
    id: int = Field(examples=[7])
    dataset_id: int = Field(examples=[1])
    models: list[ComparisonModelOut]
    params: dict[str, Any]
    diagnostics: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    created_at: Timestamp
    links: dict[str, str] = Field(
        examples=[
            {"matrix": "/v1/comparisons/7/matrix", "heatmap_png": "/v1/comparisons/7/heatmap.png"}
        ]
    )


class MatrixOut(BaseModel):
    comparison_id: int = Field(examples=[7])
    a: str = Field(examples=["mixer_digits"])
    b: str = Field(examples=["sw_mlp_digits"])
    rows: list[str] = Field(description="Layers of model a", examples=[["blocks.0", "norm"]])
    cols: list[str] = Field(description="Layers of model b", examples=[["blocks.0", "norm"]])
    values: list[list[float | None]] = Field(
        description="CKA, rows × cols; null where undefined", examples=[[[0.98, 0.5], [0.4, 0.9]]]
    )
