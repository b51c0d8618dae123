"""Request and response bodies of the REST API, with the examples shown in OpenAPI."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from app.jobs.requests import (
    ComparisonIn,
    Estimator,
    Feature,
    Mode,
    StudyIn,
    TrainingIn,
)
from app.store.orm import JobState
from app.store.values import ID_MAX, NO_NUL, clean_name

__all__ = [
    "ID_MAX",
    "NO_NUL",
    "ArchitectureOut",
    "ComparisonIn",
    "ComparisonOut",
    "DatasetOut",
    "Estimator",
    "Feature",
    "MatrixOut",
    "Mode",
    "ModelOut",
    "Page",
    "StudyIn",
    "StudyOut",
    "TrainingIn",
    "TrainingOut",
    "clean_name",
]

T = TypeVar("T")


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
    aliases: list[str] = Field(
        default_factory=list,
        examples=[["mixer_again"]],
        description="Other names of these weights, oldest first: an upload of weights stored "
        "already returns the stored model (200), and a name it was sent with that the model "
        "does not have is added here",
    )
    arch: str = Field(examples=["mixer_digits"])
    source: str = Field(examples=["upload"], description="upload, timm, training or zoo")
    sha256: str = Field(examples=["9f2c…"], description="sha256 of the safetensors file")
    size_bytes: int = Field(examples=[81234], description="Bytes of the checkpoint's weights")
    artifact_bytes: int = Field(
        0,
        examples=[2097152],
        description="Bytes of the stored Grams, blocks and heatmaps of the comparisons "
        "that include it (what deleting it with force may free)",
    )
    config: dict[str, Any] = Field(examples=[{"depth": 4, "hidden_dim": 32}])
    input_shape: list[int] = Field(examples=[[1, 8, 8]])
    num_classes: int | None = Field(default=None, examples=[10])
    parameters: int = Field(examples=[20330])
    connections: int | None = Field(
        default=None, description="Ω, weights in the token/channel maps"
    )
    default_layers: list[str] = Field(examples=[["blocks.0", "blocks.1", "norm"]])
    family: str | None = Field(default=None, examples=["sw_mlp"])
    omega: int | None = Field(
        default=None, description="Ω: connections per effective layer", examples=[24576]
    )
    effective_width: int | None = Field(
        default=None, description="m = S·C for token-mixing families", examples=[512]
    )
    density: float | None = Field(
        default=None, description="p of the SW-MLP (1 for the dense MLP)", examples=[0.046875]
    )
    S: int | None = Field(default=None, description="tokens", examples=[16])
    C: int | None = Field(default=None, description="channels per token", examples=[32])
    gamma: float | None = Field(default=None, description="expansion γ", examples=[2.0])
    training_key: str | None = Field(
        default=None,
        description="Identity of a service training (arch, options, seed, dataset, recipe)",
    )
    sidecar: dict[str, Any] = Field(description="The checkpoint's JSON sidecar (metrics, data)")
    preprocessing: dict[str, Any] | None = Field(
        default=None,
        description="How an image becomes this model's input: input_size, interpolation, "
        "crop_pct, crop_mode, mean, std (timm's data config)",
    )
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


class HolderOut(BaseModel):
    requester: str = Field(
        examples=["token:3"],
        description="token:ID (a database token), env:DIGEST (one of CKA_API_TOKENS), "
        "anonymous (no tokens configured), cli:USER (cka-atlas study run) or study:ID",
    )
    label: str | None = Field(default=None, examples=["alice"], description="Its name")
    since: datetime


class JobFields(BaseModel):
    status: JobState = Field(examples=["running"])
    progress: float = Field(ge=0, le=1, examples=[0.4])
    eta_s: float | None = Field(default=None, description="Seconds left, from the rate so far")
    error: str | None = Field(default=None, examples=[None])
    error_code: str | None = Field(default=None, examples=[None])
    attempts: int = Field(examples=[1])
    started_at: datetime | None = None
    finished_at: datetime | None = None
    held_by: list[HolderOut] = Field(
        default_factory=list,
        description="Who still wants it: the requesters of a shared (deduplicated) job that "
        "have not cancelled. A cancel withdraws the caller's interest; the job stops when "
        "none is left. A shard or a study's training lists none: its parent job holds it",
    )


class TrainingOut(JobFields):
    id: int = Field(examples=[1])
    arch: str = Field(examples=["mixer_digits"])
    dataset_id: int = Field(examples=[1])
    params: dict[str, Any]
    model_id: int | None = Field(default=None, description="The registered model once succeeded")
    training_key: str | None = Field(
        default=None,
        description="Identity (arch, options, seed, dataset, recipe) a study reuses the model by",
    )
    created_at: datetime


class ComparisonModelOut(BaseModel):
    id: int
    label: str


class ComparisonOut(JobFields):
    id: int = Field(examples=[7])
    dataset_id: int = Field(examples=[1])
    models: list[ComparisonModelOut]
    params: dict[str, Any]
    options: dict[str, Any] = Field(
        default_factory=dict,
        examples=[{"feature": "mean_tokens", "baselines": ["random_init"]}],
        description="The comparison options of `params` that are not their defaults (a "
        "default that depends on other options taken with them); the list filters on them "
        "with `option=NAME=VALUE`",
    )
    diagnostics: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    created_at: datetime
    size_bytes: int = Field(
        0,
        examples=[1048576],
        description="Bytes of the stored Grams, blocks and heatmaps it references "
        "(an artifact shared with another comparison counts in both)",
    )
    frees_bytes: int = Field(
        0,
        examples=[524288],
        description="Bytes that deleting it frees: its artifacts that no other comparison "
        "references (shared ones stay with the others)",
    )
    links: dict[str, str] = Field(
        examples=[
            {"matrix": "/v1/comparisons/7/matrix", "heatmap_png": "/v1/comparisons/7/heatmap.png"}
        ]
    )


Cells = list[list[float | None]]


class MatrixOut(BaseModel):
    comparison_id: int = Field(examples=[7])
    a: str = Field(examples=["mixer_digits"])
    b: str = Field(examples=["sw_mlp_digits"])
    rows: list[str] = Field(description="Layers of model a", examples=[["blocks.0", "norm"]])
    cols: list[str] = Field(description="Layers of model b", examples=[["blocks.0", "norm"]])
    measure: str = Field(default="cka", description="What `values` holds (the `measure` asked for)")
    measures: list[str] = Field(
        default_factory=lambda: ["cka"],
        description="The measures this comparison computed (option `measures`)",
    )
    values: list[list[float | None]] = Field(
        description="CKA (or `measure`), rows × cols; null where undefined",
        examples=[[[0.98, 0.5], [0.4, 0.9]]],
    )
    cca_degenerate: list[list[bool]] | None = Field(
        default=None,
        description="With a CCA-family measure: per cell, whether CCA is degenerate there "
        "(its layers' ranks add past n − 1: some canonical correlations are 1 whatever the "
        "data; docs/measures.md)",
    )
    flags: dict[str, list[list[bool]]] = Field(
        default_factory=dict,
        description="Per flag of `measure`, per cell whether it is raised there: the value is "
        "then fixed, or mostly fixed, by the sample's size rather than by the layers "
        "(`cca_degenerate`, `linreg_saturated`, `procrustes_saturated`, "
        '`mutual_knn_few_images`; docs/measures.md, "Flags"). Empty for CKA',
        examples=[{"linreg_saturated": [[True, False], [False, False]]}],
    )
    ci_low: Cells | None = Field(
        default=None, description="95 % interval, lower bound (with `interval`)"
    )
    ci_high: Cells | None = Field(
        default=None, description="95 % interval, upper bound (with `interval`)"
    )
    p_value: Cells | None = Field(
        default=None,
        description="One-sided p-value of CKA under the within-batch permutation null (with "
        "`null`): `analytic`, a Pearson type III on the null's exact moments; `permutation`, "
        "(1 + #{null ≥ observed}) / (1 + P)",
    )
    q_value: Cells | None = Field(
        default=None,
        description="Benjamini–Hochberg q-value over the comparison's cells (every pair of "
        "distinct layers once); at or above 0.05 the cell is not told apart from shuffled "
        "samples",
    )
    p_method: list[list[str | None]] | None = Field(
        default=None,
        description="What each cell's `p_value` rests on: `analytic` (the Pearson type III "
        "fitted to the null's exact moments), `monte_carlo` (sequential within-batch "
        "permutations, where the analytic fit fails its tail check), `bound` (the exact "
        "moments' tail bound, already below the smallest Monte Carlo p) or `permutation` (the "
        "brute-force null, `permutations` > 0); null in a cell without a p-value, and the "
        "whole field null for a comparison stored before methods were recorded "
        "(docs/analytic-null.md)",
        examples=[[["analytic", "monte_carlo"]]],
    )
    null_mean: Cells | None = Field(
        default=None,
        description="Mean CKA under the null (with `null`): 0 for the unbiased estimator, the "
        "estimator's bias for the biased one",
    )
    null_q95: Cells | None = Field(
        default=None, description="95 % quantile of the null CKA (with `null`)"
    )
    sensitivity: Cells | None = Field(
        default=None,
        description="The larger move of CKA when either side's top principal component is "
        "removed (with `sensitivity`)",
    )
    baselines: dict[str, Cells] | None = Field(
        default=None,
        description="`random_init`: the same cell between untrained twins, the mean over "
        "`random_init_draws` draws, and `random_init_sd` its standard deviation over them; "
        "`seed_ceiling`: the cell with a model replaced by a seed sibling that is not the other "
        "side (null where none); only those asked for",
    )
    undefined_baselines: dict[str, str] | None = Field(
        default=None,
        description="Per baseline left undefined for this pair, why: e.g. `no sibling other "
        "than the compared model` (a baseline never compares a model with itself)",
        examples=[{"seed_ceiling": "no sibling other than the compared model"}],
    )
    verdicts: dict[str, list[list[float | str | None]]] | None = Field(
        default=None,
        description="Each cell against its baselines (with `baselines`; docs/reading-a-cell.md): "
        "`learned` (CKA minus the untrained twins' mean) with its 95 % interval `learned_low`, "
        "`learned_high` (the cell's interval and the twins' spread over their draws, "
        "Welch–Satterthwaite) and `learned_verdict`: `above_untrained` (the interval lies above "
        "0), `not_above_untrained` (it reaches below 0 and stays under the margin 0.05) or "
        "`undecided` (it covers both 0 and 0.05); `seed_gap` (CKA minus the seed ceiling) with "
        "`seed_gap_low`, `seed_gap_high` and `seed_verdict`: `below_seed_ceiling` (the interval "
        "lies below 0), `within_seed_spread` (it reaches 0 and stays above −0.05) or "
        "`undecided`; null where a cell has none",
        examples=[{"learned": [[0.12]], "learned_verdict": [["above_untrained"]]}],
    )
    verdict_images: dict[str, Literal["paired", "summed"]] | None = Field(
        default=None,
        description="Per question of `verdicts` (`learned`, `seed`), whether the image part of "
        "its difference's variance is `paired` (the cell and its twins or sibling over the same "
        "images, image by image) or `summed` (the projections were not kept: over their cap, "
        "batch-bootstrap intervals, or a result stored before; docs/reading-a-cell.md)",
        examples=[{"learned": "paired", "seed": "paired"}],
    )


class StudyMemberOut(BaseModel):
    position: int
    name: str = Field(examples=["sw_mlp[density=0.125]-s0"])
    arch: str = Field(examples=["sw_mlp_digits"])
    seed: int = Field(examples=[0])
    training_key: str = Field(description="sha256 of (arch, options, seed, dataset, recipe)")
    model_id: int | None = Field(default=None, description="Set once trained or reused")
    job_id: int | None = Field(
        default=None, description="The training's own job (none when reused); /v1/jobs/{id}"
    )
    status: JobState | None = Field(default=None, description="The training job's state")
    worker: str | None = Field(default=None, description="The worker that ran it last")
    seconds: float | None = Field(default=None, description="How long it took, once done")
    reused: bool | None = Field(
        default=None, description="True: an existing model with this key was reused"
    )


class StudyTrainingsOut(BaseModel):
    total: int = Field(examples=[16])
    done: int = Field(examples=[5])
    reused: int = Field(examples=[3])
    trained: int = Field(examples=[2])


class StudyOut(JobFields):
    id: int = Field(examples=[3])
    name: str = Field(examples=["sparsity"])
    dataset_id: int = Field(examples=[1])
    params: dict[str, Any] = Field(
        examples=[{"builtin": "sparsity", "seeds": [0, 1], "quick": True, "trainings": 16}]
    )
    stage: str = Field(
        examples=["trainings"], description="queued, trainings, comparison, summary or done"
    )
    trainings: StudyTrainingsOut
    models: list[StudyMemberOut]
    comparison_id: int | None = None
    job_id: int = Field(
        examples=[7], description="The study's job; its trainings are its children in /v1/jobs"
    )
    spec: dict[str, Any] | None = Field(default=None, description="The expanded study spec")
    created_at: datetime
    links: dict[str, str]
