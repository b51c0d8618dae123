"""What a client asks a job to do: the bodies of a training and a comparison request.

Validated here once, whether the request came over REST, from the CLI or from the web form;
:mod:`app.jobs.submit` checks them against the database and queues the job. The comparison
options are :class:`analysis.CompareOptions`: their types, allowed values, defaults and
descriptions are taken from it (:func:`option`), with only the service's own caps added here
(batch and bootstrap sizes a worker accepts, layer-name lengths a column holds).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from analysis.hsic import Estimator
from analysis.layers import FeaturePolicy as Feature
from analysis.options import MAX_PERMUTATIONS, CompareOptions, Mode, NullKind
from analysis.studies.spec import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_LR, MAX_SEED
from app.store.values import NO_NUL, Id, Text

__all__ = [
    "BASELINES",
    "COMPARE_FIELDS",
    "MAX_BATCH",
    "MAX_LAYER_ITEMS",
    "MAX_MODELS",
    "MAX_PERMUTATIONS",
    "MAX_SHARDS",
    "Baseline",
    "Calibration",
    "ComparisonIn",
    "Estimator",
    "Feature",
    "Kernel",
    "Mode",
    "StudyIn",
    "TrainingIn",
]


# "linear", "rbf" (median heuristic) or "rbf:T" (bandwidth T × median distance).
Kernel = Annotated[str, StringConstraints(pattern=r"^(linear|rbf(:[0-9.eE+-]{1,20})?)$")]
# A layer name or glob, or an index into the default layers (negative counts from the end);
# an index is a JSON integer, never a boolean.
LayerName = Annotated[str, StringConstraints(max_length=200), NO_NUL]
LayerIndex = Annotated[int, Field(strict=True, ge=-10_000, le=10_000)]
Baseline = Literal["random_init", "seed_ceiling"]
BASELINES: tuple[Baseline, ...] = ("random_init", "seed_ceiling")
MAX_MODELS = 32
MAX_BATCH = 8192
MAX_LAYER_ITEMS = 200
# More shards than workers only adds per-shard overhead (every shard loads every model); 64
# covers a host of 8 GPUs several times over.
MAX_SHARDS = 64


# The fields of a comparison request that are CompareOptions (the rest says what to compare).
COMPARE_FIELDS = frozenset(
    {"layers", "kernel", "estimator", "mode", "batch_size", "feature", "bootstrap"}
    | {"permutations", "null", "sensitivity", "random_init_draws"}
)


def option(name: str, **caps: Any) -> Any:
    """A request field for comparison option ``name``: default, description and bounds from
    :class:`analysis.CompareOptions`, plus the service's ``caps`` (e.g. ``le=MAX_BATCH``)."""
    info = CompareOptions.model_fields[name]
    bounds = {k: getattr(m, k) for m in info.metadata for k in ("ge", "le") if hasattr(m, k)}
    return Field(default=info.default, description=info.description, **(bounds | caps))


class TrainingIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"arch": "mixer_digits", "dataset_id": 1, "epochs": 5, "seed": 0},
                {
                    "arch": "sw_mlp_digits",
                    "dataset_id": 1,
                    "config": {"density": 0.125, "depth": 6},
                },
            ]
        },
    )

    arch: Text = Field(min_length=1, description="A preset or timm name")
    dataset_id: Id
    epochs: int = Field(default=5, ge=1, le=MAX_EPOCHS)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    batch_size: int | None = Field(
        default=None, ge=1, le=MAX_BATCH_SIZE, description="Default: the recipe's"
    )
    lr: float | None = Field(default=None, gt=0, le=MAX_LR, description="Default: the recipe's")
    name: Text | None = Field(default=None, description="Name of the resulting model")
    config: dict[str, Any] = Field(
        default_factory=dict,
        max_length=64,
        description="Architecture options (GET /v1/architectures/{name} lists a preset's), "
        'e.g. {"density": 0.125, "depth": 6}; checked before anything is queued',
    )


class Calibration(BaseModel):
    """What a cell is measured against: a null (analytic or permutation), top-component
    sensitivity and the
    baselines. The one place these options are validated, for REST, the form and the CLI."""

    model_config = ConfigDict(extra="forbid")

    permutations: int = option("permutations", ge=0, le=MAX_PERMUTATIONS)
    null: NullKind = option("null")
    sensitivity: bool = option("sensitivity")
    random_init_draws: int = option("random_init_draws")
    baselines: list[Baseline] = Field(
        default_factory=list,
        max_length=8,
        description="`random_init`: the same architectures and options, untrained "
        "(`random_init_draws` twins per model, each its own seed), through the same pipeline. "
        "`seed_ceiling`: for a model with a sibling in the store (same architecture, options "
        "and dataset, another seed), the sibling's CKA with the other side. No baseline "
        "compares a model with itself: where it would, the block is undefined, with its "
        "reason. A comma-separated string is read too.",
        examples=[[], ["random_init", "seed_ceiling"]],
    )

    @field_validator("baselines", mode="before")
    @classmethod
    def _split_baselines(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("baselines")
    @classmethod
    def _canonical_baselines(cls, value: list[Baseline]) -> list[Baseline]:
        # Order and repetition do not change the work: one canonical list, one request hash.
        return [b for b in BASELINES if b in value]


class ComparisonIn(Calibration):
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
                    "permutations": 0,
                    "null": "analytic",
                    "sensitivity": False,
                    "random_init_draws": 3,
                    "baselines": [],
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
    kernel: Kernel = option("kernel")
    estimator: Estimator = option("estimator")
    mode: Mode = option("mode")
    batch_size: int = option("batch_size", ge=2, le=MAX_BATCH)
    feature: Feature = option("feature")
    bootstrap: int = option("bootstrap", ge=0, le=1000)
    shards: int = Field(
        default=1,
        ge=1,
        le=MAX_SHARDS,
        description="Split the comparison by ranges of batches into this many shard jobs, run "
        "by any free workers and combined exactly (mode minibatch only). 1: one piece, unless "
        "it has more batches than CKA_SHARD_BATCHES. Never changes the result.",
    )
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


MAX_STUDY_SEEDS = 10


class StudyIn(BaseModel):
    """A study to run: a built-in one by name, or a whole spec document (a JSON object)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"builtin": "sparsity", "seeds": 3},
                {"builtin": "width", "seeds": 2, "quick": True},
            ]
        },
    )

    builtin: Literal["sparsity", "width"] | None = Field(
        default=None, description="A built-in study: `sparsity` or `width`"
    )
    spec: dict[str, Any] | None = Field(
        default=None,
        description="A study spec (the YAML document as JSON): name, dataset (built-in), recipe, "
        "seeds, reference, arms, cka, plot",
    )
    seeds: int | None = Field(
        default=None, ge=1, le=MAX_STUDY_SEEDS, description="Seeds 0..N-1 (default: the spec's)"
    )
    quick: bool = Field(default=False, description="The spec's quick recipe (1 epoch)")

    @model_validator(mode="after")
    def _one_source(self) -> StudyIn:
        if (self.builtin is None) == (self.spec is None):
            raise ValueError("give exactly one of builtin or spec")
        return self
