"""What a client asks a job to do: the bodies of a training and a comparison request.

Validated here once, whether the request came over REST, from the CLI or from the web form;
:mod:`app.jobs.submit` checks them against the database and queues the job. A comparison
request *is* an :class:`analysis.CompareOptions` (:class:`ComparisonIn` subclasses it): every
option, its type, allowed values, default, description and the rules between options come from
there, and a new option reaches REST, the form and the stored params without a line here. This
module adds what to compare (models, dataset), how to run it (shards, force) and the service's
own caps (a batch size a worker accepts, layer-name lengths a column holds); the per-model
mapping of ``layers`` is the library's alone (the service applies one selection to every model).
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
    WrapValidator,
    field_validator,
    model_validator,
)

from analysis.estimators.hsic import Estimator
from analysis.layers import FeaturePolicy as Feature
from analysis.options import BASELINES, MAX_PERMUTATIONS, Baseline, CompareOptions, Mode
from analysis.studies.spec import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_LR, MAX_SEED
from app.store.values import ID_MAX, NO_NUL, Id, Text

__all__ = [
    "BASELINES",
    "COMPARE_FIELDS",
    "MAX_BATCH",
    "MAX_LAYER_ITEMS",
    "MAX_MODELS",
    "MAX_PERMUTATIONS",
    "MAX_SHARDS",
    "Baseline",
    "ComparisonIn",
    "Estimator",
    "Feature",
    "Mode",
    "StudyIn",
    "TrainingIn",
]


# A layer name or glob, or an index into the default layers (negative counts from the end);
# an index is a JSON integer, never a boolean.
LayerName = Annotated[str, StringConstraints(max_length=200), NO_NUL]
LayerIndex = Annotated[int, Field(strict=True, ge=-10_000, le=10_000)]
MAX_MODELS = 32


def _one_model_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    # A union reports one error per member ("model_ids.0.constrained-int"): one sentence at
    # the item instead.
    try:
        return handler(value)
    except ValidationError:
        raise ValueError(
            f"a model is its id (1 to {ID_MAX}) or its name (1 to 200 characters)"
        ) from None


# A model by its id, or by its name (what a model's name column holds).
ModelRef = Annotated[
    Id | Annotated[str, StringConstraints(min_length=1, max_length=200), NO_NUL],
    WrapValidator(_one_model_error),
]
MAX_BATCH = 8192
MAX_LAYER_ITEMS = 200
RestLayers = (
    LayerName
    | LayerIndex
    | Annotated[list[LayerName | LayerIndex], Field(max_length=MAX_LAYER_ITEMS)]
    | None
)
# More shards than workers only adds per-shard overhead (every shard loads every model); 64
# covers a host of 8 GPUs several times over.
MAX_SHARDS = 64


# The fields of a comparison request that are CompareOptions (the rest says what to compare).
COMPARE_FIELDS = frozenset(CompareOptions.model_fields)


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


class ComparisonIn(CompareOptions):
    """A comparison request: the models and dataset, and every :class:`CompareOptions` field."""

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
                    "interval": "images",
                    "null": "analytic",
                    "baselines": ["random_init", "seed_ceiling"],
                }
            ]
        },
    )

    model_ids: list[ModelRef] = Field(
        min_length=1,
        max_length=MAX_MODELS,
        description="One or more models, each by its id or by its name (or an alias) when "
        "only one model has it",
        examples=[[1, 2], ["mixer_digits", 2]],
    )
    dataset_id: Id
    # The library's selection less its per-model mapping, with the column's limits. The length
    # limits sit on each member of the union: a bare max_length on the field would also be
    # applied to an integer selection and fail inside pydantic.
    layers: RestLayers = Field(  # type: ignore[assignment]
        default=None,
        description="Layer selection applied to every model: null for the default layers, "
        "a name, a glob such as `blocks.*` (`**` crosses dots), an index into the default "
        "layers (negative counts from the end), or a list of these.",
        examples=[None, "blocks.*", ["blocks.0", "norm"]],
    )
    batch_size: int = option("batch_size", le=MAX_BATCH)
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

    def options(self) -> CompareOptions:
        """The request's :class:`CompareOptions` (the library's own type)."""
        return CompareOptions.model_validate(self.model_dump(include=set(COMPARE_FIELDS)))


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

    builtin: Literal["sparsity", "width", "layer_identification"] | None = Field(
        default=None,
        description="A built-in study: `sparsity`, `width` or `layer_identification`",
    )
    spec: dict[str, Any] | None = Field(
        default=None,
        description="A study spec (the YAML document as JSON): name, dataset (built-in), recipe, "
        "seeds, reference, arms, cka, plot, quick_seeds, identification; an arm may name a "
        "model of the store (`model`: its id or name) instead of `arch`, to train more seeds "
        "of its architecture and options",
    )
    seeds: int | None = Field(
        default=None, ge=1, le=MAX_STUDY_SEEDS, description="Seeds 0..N-1 (default: the spec's)"
    )
    quick: bool = Field(
        default=False,
        description="The spec's quick recipe (1 epoch); its quick_seeds if seeds is not given",
    )

    @model_validator(mode="after")
    def _one_source(self) -> StudyIn:
        if (self.builtin is None) == (self.spec is None):
            raise ValueError("give exactly one of builtin or spec")
        return self
