"""Request and response bodies of the REST API, with the examples shown in OpenAPI."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
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
]

T = TypeVar("T")
# "linear", "rbf" (median heuristic) or "rbf:T" (bandwidth T × median distance).
Kernel = Annotated[str, StringConstraints(pattern=r"^(linear|rbf(:[0-9.eE+-]{1,20})?)$")]
Estimator = Literal["unbiased", "biased"]
Mode = Literal["minibatch", "full"]
Feature = Literal["flatten", "mean_tokens"]
LayerItem = Annotated[str, StringConstraints(max_length=200)] | int
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
    created_at: datetime


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
    created_at: datetime


class JobFields(BaseModel):
    status: JobStatus = Field(examples=["running"])
    progress: float = Field(ge=0, le=1, examples=[0.4])
    eta_s: float | None = Field(default=None, description="Seconds left, from the rate so far")
    error: str | None = Field(default=None, examples=[None])
    error_code: str | None = Field(default=None, examples=[None])
    attempts: int = Field(examples=[1])
    started_at: datetime | None = None
    finished_at: datetime | None = None


class TrainingIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"arch": "mixer_digits", "dataset_id": 1, "epochs": 5, "seed": 0}]
        },
    )

    arch: str = Field(min_length=1, max_length=200, description="A preset or timm name")
    dataset_id: int
    epochs: int = Field(default=5, ge=1, le=1000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    batch_size: int | None = Field(default=None, ge=1, le=8192, description="Default: the recipe's")
    lr: float | None = Field(default=None, gt=0, le=10, description="Default: the recipe's")
    name: str | None = Field(
        default=None, max_length=200, description="Name of the resulting model"
    )


class TrainingOut(JobFields):
    id: int = Field(examples=[1])
    arch: str = Field(examples=["mixer_digits"])
    dataset_id: int = Field(examples=[1])
    params: dict[str, Any]
    model_id: int | None = Field(default=None, description="The registered model once succeeded")
    created_at: datetime


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

    model_ids: list[int] = Field(min_length=1, max_length=32, description="One or more models")
    dataset_id: int
    layers: str | int | list[Annotated[str, StringConstraints(max_length=200)] | int] | None = (
        Field(
            default=None,
            max_length=200,
            description="Layer selection applied to every model: null for the default layers, "
            "a name, a glob such as `blocks.*` (`**` crosses dots), an index into the default "
            "layers, or a list of these.",
            examples=[None, "blocks.*", ["blocks.0", "norm"]],
        )
    )
    kernel: Kernel = Field(default="linear", description="`linear`, `rbf` or `rbf:T`")
    estimator: Estimator = "unbiased"
    mode: Mode = "minibatch"
    batch_size: int = Field(
        default=256, ge=2, le=65536, description="≥ 4 for the unbiased estimator"
    )
    feature: Feature = "flatten"
    bootstrap: int = Field(default=0, ge=0, le=1000)
    force: bool = Field(
        default=False, description="Recompute even if an identical comparison exists"
    )


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
    created_at: datetime
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
