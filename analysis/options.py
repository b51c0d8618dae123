"""Every option of a comparison, defined once: its type, default, allowed values and meaning.

:class:`CompareOptions` is what :func:`analysis.compare` runs with. Its fields are the options
that change the numbers of an atlas or are recorded with them; plumbing (the device, progress
bars, the Gram store, callbacks) stays keyword arguments of :func:`analysis.compare`.

A service derives its request schema, command-line flags and form from these fields rather than
listing them again: :meth:`CompareOptions.model_json_schema` gives each option's JSON Schema
(choices as ``enum``, ranges as ``minimum``/``maximum``, a ``default`` and a ``description``),
:func:`option_specs` the same facts as plain Python values, and ``CompareOptions.model_fields``
the pydantic fields themselves, whose per-field validators travel with them (they sit in the
annotations), so ``pydantic.create_model`` can reuse them in a request body.

Values are canonical once validated: the kernel is the string
:func:`analysis.estimators.kernels.parse_kernel` reads back (``"RBF:0.50"`` becomes
``"rbf:0.5"``), the dtype one of ``"fp32"``, ``"bf16"``, ``"fp16"`` (``None``, torch dtypes and
the long names are read too), a list of layers a tuple.

Options that depend on others are checked after them (fields validate in order):
``batch_size`` must reach the estimator's smallest batch
(:data:`analysis.estimators.hsic.MIN_SAMPLES`), an ``interval`` needs ``minibatch`` mode,
and ``baselines`` turn ``interval`` ``"none"`` into ``"images"`` (a verdict weighs a cell's
difference from its baseline against the cell's own interval, :mod:`analysis.inference.verdicts`).

``interval`` is the intervals' switch and unit, ``resamples`` the batch bootstrap's count.
``bootstrap``, the single number that used to mean both, is still read (deprecated):
``bootstrap=0`` is ``interval="none"``; ``bootstrap=N`` is ``resamples=N`` with the unit given
in ``interval`` (``"images"`` when none is given). It is never kept: a validated value's
``bootstrap`` is None. Invalid values make the constructor raise pydantic's
``ValidationError``, each error located at its field and typed (``invalid_kernel``,
``batch_too_small``, … see :data:`ERROR_TYPES`; the rest are pydantic's own types);
:meth:`CompareOptions.build`, which :func:`analysis.compare` uses, raises :class:`OptionsError`
instead, one sentence that starts with the field's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import torch
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from analysis.batch_statistics.protocol import Switch
from analysis.batch_statistics.registry import SWITCHES
from analysis.errors import AnalysisError, EstimatorError, OptionsError
from analysis.estimators.hsic import MIN_SAMPLES, Estimator
from analysis.estimators.kernels import RBF_T_MAX, RBF_T_MIN, Kernel, parse_kernel
from analysis.inference.bootstrap import MIN_BOOTSTRAP_BATCHES, check_bootstrap_batches
from analysis.layers import FeaturePolicy
from analysis.measures import (
    DEFAULT_K,
    MEASURES,
    REGISTERED,
    MeasureName,
    budget_bytes,
    estimate_bytes,
)
from analysis.measures.budget import BUDGET_ENV, gib

__all__ = [
    "BASELINES",
    "DTYPES",
    "ERROR_TYPES",
    "KERNEL_PATTERN",
    "MAX_RANDOM_INIT_DRAWS",
    "MAX_RESAMPLES",
    "MIN_BOOTSTRAP_BATCHES",
    "MODES",
    "NULLS",
    "Baseline",
    "CompareOptions",
    "Dtype",
    "IntervalUnit",
    "Layers",
    "Mode",
    "NullKind",
    "OptionSpec",
    "OptionsError",
    "add_switches",
    "option_specs",
]

Mode = Literal["minibatch", "full"]
NullKind = Literal["analytic", "permutation", "none"]
NULLS: tuple[NullKind, ...] = get_args(NullKind)
MODES: tuple[Mode, ...] = get_args(Mode)
IntervalUnit = Literal["none", "images", "batches"]
Baseline = Literal["random_init", "seed_ceiling"]
BASELINES: tuple[Baseline, ...] = get_args(Baseline)
Dtype = Literal["fp32", "bf16", "fp16"]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
_DTYPE_NAMES: dict[str, Dtype] = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16"}
_DTYPE_NAMES |= {"bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
_TORCH_DTYPES: dict[torch.dtype, Dtype] = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
MAX_PERMUTATIONS = 10_000
MAX_RANDOM_INIT_DRAWS = 20
MAX_RESAMPLES = 10_000
# What a kernel spec looks like (the validator parses it; the pattern is for schemas and forms).
KERNEL_PATTERN = r"^(linear|rbf(:[0-9.eE+-]{1,20})?)$"

# The error types of this module's own checks; a service may map them to its problem codes.
ERROR_TYPES = (
    "invalid_kernel",
    "invalid_dtype",
    "invalid_layers",
    "batch_too_small",
    "interval_needs_minibatch",
    "invalid_baselines",
    "calibration_needs_minibatch",
    "null_needs_permutations",
    "too_few_batches",
    "invalid_measures",
)


def _error(kind: str, reason: str) -> PydanticCustomError:
    # The reason goes in as context: a message with braces in it is never read as a template.
    return PydanticCustomError(kind, "{reason}", {"reason": reason})


def _kernel(value: object) -> str:
    if not isinstance(value, str | Kernel):
        raise _error("invalid_kernel", "a kernel is a string: 'linear', 'rbf' or 'rbf:T'")
    try:
        return parse_kernel(value).spec
    except EstimatorError as exc:
        raise _error("invalid_kernel", str(exc)) from None


def _dtype(value: object) -> object:
    if value is None:
        return "fp32"
    if isinstance(value, torch.dtype):
        if value not in _TORCH_DTYPES:
            raise _error(
                "invalid_dtype", f"autocast dtype must be bfloat16 or float16, not {value}"
            )
        return _TORCH_DTYPES[value]
    if isinstance(value, str) and value in _DTYPE_NAMES:
        return _DTYPE_NAMES[value]
    raise _error("invalid_dtype", f"unknown dtype {value!r}; use 'bf16', 'fp16' or 'fp32'")


def _layers(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    # A union reports one error per member, at pydantic's internal member tags; answer with one.
    try:
        return handler(value)
    except ValidationError:
        raise _error(
            "invalid_layers",
            "expected None, a layer name or glob, an integer index, a list of these, or a "
            "mapping from model name to one of these",
        ) from None


KernelSpec = Annotated[str, BeforeValidator(_kernel)]
DtypeName = Annotated[Dtype, BeforeValidator(_dtype)]
# An index is an int, never a bool; strings of digits are indices too (see resolve_layers).
LayerIndex = Annotated[int, Strict()]
Selection = str | LayerIndex | tuple[str | LayerIndex, ...]
Layers = Annotated[Selection | dict[str, Selection | None] | None, WrapValidator(_layers)]
Baselines = tuple[Baseline, ...]


class CompareOptions(BaseModel):
    """The options of one comparison; immutable, validated as a whole, canonical once built."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: Layers = Field(
        default=None,
        description=(
            "Which layers of each model: None for its default layers (stem, blocks, norm, "
            "pre-logits), a name, a glob such as `blocks.*` (`**` crosses dots), an index into "
            "the default layers (negative counts from the end), a list of these, or a mapping "
            "from model name to one of these. Checked against each model before any forward "
            "pass."
        ),
        examples=[None, "blocks.*", ["blocks.0", "norm"], -1],
    )
    kernel: KernelSpec = Field(
        default="linear",
        description=(
            "`linear`, `rbf` (bandwidth: the batch's median pairwise distance), or `rbf:T` "
            f"(T, from {RBF_T_MIN:g} to {RBF_T_MAX:g}, times that bandwidth)."
        ),
        examples=["linear", "rbf", "rbf:0.5"],
        json_schema_extra={"pattern": KERNEL_PATTERN},
    )
    estimator: Estimator = Field(
        default="unbiased",
        description=(
            "HSIC estimator: `unbiased` (Song et al. 2012; batches of at least 4) or `biased` "
            "(Gretton et al. 2005; batches of at least 2)."
        ),
    )
    mode: Mode = Field(
        default="minibatch",
        description=(
            "`minibatch` sums HSIC over consecutive batches of `batch_size` (memory does not grow "
            "with the dataset); `full` is exact over every sample at once (memory grows with n)."
        ),
    )
    batch_size: int = Field(
        default=256,
        ge=min(MIN_SAMPLES.values()),
        description=(
            "Samples per batch: the minibatch plan, and the loading size in full mode; at least "
            "4 for the unbiased estimator, 2 for the biased one."
        ),
    )
    feature: FeaturePolicy = Field(
        default="flatten",
        description=(
            "How a layer's activation becomes one vector per sample: `flatten` keeps every "
            "token or position (class/register tokens included), `mean_tokens` averages over "
            "the patch tokens or positions, `cls` keeps a model's class token only."
        ),
    )
    dtype: DtypeName = Field(
        default="fp32",
        description=(
            "Precision of the forward pass: `fp32`, or autocast to `bf16` or `fp16` (Grams and "
            "HSIC stay fp32/float64)."
        ),
    )
    baselines: Baselines = Field(
        default=(),
        description=(
            "References for every cell, run through the same pipeline: `random_init` "
            "(untrained twins of each model, `random_init_draws` of them, each its own seed) and "
            "`seed_ceiling` (a model replaced by a seed sibling: the same architecture, options "
            "and training data, another seed). No baseline compares a model with itself; where "
            "it would, the block is undefined, with its reason. Each cell then carries its "
            "verdicts (learned: above the untrained twins? within the seed spread?), which weigh "
            "the difference against the cell's interval: baselines turn `interval` `none` into "
            "`images`. A comma-separated string is read too."
        ),
        examples=[(), ("random_init", "seed_ceiling")],
    )
    interval: IntervalUnit = Field(
        default="none",
        validate_default=True,  # baselines turn the default on
        description=(
            "95 % intervals per cell, and their unit: `none`, `images` (every image a draw: the "
            "first-order Hoeffding projection of HSIC, valid at any batch size, no resamples) "
            "or `batches` (a percentile bootstrap over whole batches, `resamples` of them, "
            f"refused below {MIN_BOOTSTRAP_BATCHES} batches). Needs minibatch mode."
        ),
    )
    resamples: int = Field(
        default=1000,
        ge=1,
        le=MAX_RESAMPLES,
        description="Resamples of the batch bootstrap (`interval` `batches`); unused otherwise.",
    )
    permutations: int = Field(
        default=0,
        ge=0,
        le=MAX_PERMUTATIONS,
        description=(
            "Permutations for a null distribution of CKA per cell (p-value, null mean and 95 % "
            "quantile, from the same Grams); 0 for none. Needs minibatch mode."
        ),
    )
    null: NullKind = Field(
        default="analytic",
        validate_default=True,  # the default depends on mode and permutations
        description=(
            "Null distribution of CKA per cell, for its p-value and null mean: `analytic` (exact "
            "mean, variance and skewness of the within-batch permutation null, fitted with a "
            "Pearson type III, checked against the exact fourth moment; a cell whose fit fails "
            "the check draws its own within-batch permutations: almost free), `permutation` "
            "(`permutations` shuffles of the Grams), or `none`. Minibatch mode only: in full "
            "mode `analytic` means `none`; `permutations` above 0 means `permutation`."
        ),
    )
    sensitivity: bool = Field(
        default=False,
        description=(
            "Also compute CKA with each side's top principal component over the whole sample "
            "removed (the run keeps every layer's features), and warn where that one direction "
            "carries more than half of a cell's CKA. Needs minibatch mode."
        ),
    )
    seed: int = Field(
        default=0,
        ge=0,
        description="Seed of the bootstrap resamples, the permutations and the random-init "
        "twins' weights; the same seed, the same intervals and baselines.",
    )
    random_init_draws: int = Field(
        default=3,
        ge=1,
        le=MAX_RANDOM_INIT_DRAWS,
        description=(
            "Untrained twins drawn per model for the random-init baseline (each draw its own "
            "seed, per model); the baseline is their mean, with its spread."
        ),
    )
    measures: tuple[MeasureName, ...] = Field(
        default=("cka",),
        description=(
            "Similarity measures per cell: `cka` (always computed: the atlas rests on it) and "
            "any of "
            + ", ".join(f"`{m.name}` ({m.title})" for m in REGISTERED if not m.streamed)
            + " (docs/measures.md). These need every image's "
            "features of every layer at once: a run whose estimate passes "
            f"{BUDGET_ENV} (GiB) is refused before it keeps them. Each name once; a "
            "comma-separated string is read too."
        ),
        examples=[("cka",), ("cka", "pwcca", "procrustes")],
    )
    knn_k: int = Field(
        default=DEFAULT_K,
        ge=1,
        le=1000,
        description="Neighbours per image for `mutual_knn` (Huh et al. 2024); unused otherwise.",
    )
    bootstrap: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RESAMPLES,
        description=(
            "Deprecated: `interval` and `resamples` say it apart. 0 is `interval` `none`; N > 0 "
            "is `resamples` N, with the unit in `interval` (`images` when none is given). Read, "
            "never kept (None once validated)."
        ),
        json_schema_extra={"deprecated": True},
    )

    @model_validator(mode="before")
    @classmethod
    def _read_bootstrap(cls, data: Any) -> Any:
        """The deprecated ``bootstrap`` count as ``interval`` and ``resamples``."""
        if not isinstance(data, dict) or data.get("bootstrap") is None:
            return data
        count = data["bootstrap"]
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_RESAMPLES:
            return data  # refused by the field itself, located at "bootstrap"
        out = {k: v for k, v in data.items() if k != "bootstrap"}
        if count == 0:
            out["interval"] = "none"
        else:
            out["resamples"] = count
            if out.get("interval") in (None, "none"):
                out["interval"] = "images"
        return out

    @field_validator("batch_size")
    @classmethod
    def _batch_fits_estimator(cls, value: int, info: ValidationInfo) -> int:
        estimator = info.data.get("estimator")  # absent when the estimator itself was refused
        need = MIN_SAMPLES.get(estimator, 0) if isinstance(estimator, str) else 0
        if value < need:
            raise _error(
                "batch_too_small",
                f"the {estimator} estimator needs batches of at least {need} samples, not {value}",
            )
        return value

    @field_validator("baselines", mode="before")
    @classmethod
    def _split_baselines(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("baselines")
    @classmethod
    def _canonical_baselines(cls, value: tuple[Baseline, ...]) -> tuple[Baseline, ...]:
        # Order and repetition change nothing: one canonical tuple (one request hash).
        return tuple(b for b in BASELINES if b in value)

    @field_validator("measures", mode="before")
    @classmethod
    def _split_measures(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = tuple(item.strip() for item in value.split(",") if item.strip())
        if isinstance(value, list | tuple):
            twice = sorted({m for m in value if isinstance(m, str) and list(value).count(m) > 1})
            if twice:
                raise _error("invalid_measures", f"{', '.join(twice)} named more than once")
        return value

    @field_validator("measures")
    @classmethod
    def _canonical_measures(cls, value: tuple[MeasureName, ...]) -> tuple[MeasureName, ...]:
        # CKA always runs; order changes nothing: one canonical tuple (one request hash).
        return tuple(m for m in MEASURES if m == "cka" or m in value)

    @field_validator("interval")
    @classmethod
    def _interval_fits(cls, value: IntervalUnit, info: ValidationInfo) -> IntervalUnit:
        mode = info.data.get("mode")
        if value == "none" and info.data.get("baselines") and mode == "minibatch":
            return "images"  # a verdict needs the cell's interval (analysis.inference.verdicts)
        if value != "none" and mode not in (None, "minibatch"):
            raise _error(
                "interval_needs_minibatch",
                f"intervals are computed per minibatch and need minibatch mode, not {mode}",
            )
        return value

    @field_validator("permutations", "sensitivity")
    @classmethod
    def _calibration_needs_minibatch(cls, value: Any, info: ValidationInfo) -> Any:
        mode = info.data.get("mode")
        if value and mode not in (None, "minibatch"):
            raise _error(
                "calibration_needs_minibatch",
                f"{info.field_name} works on the per-batch Grams and needs minibatch mode, "
                f"not {mode}",
            )
        return value

    @field_validator("null")
    @classmethod
    def _null_fits_permutations(cls, value: NullKind, info: ValidationInfo) -> NullKind:
        permutations, mode = info.data.get("permutations"), info.data.get("mode")
        if permutations and value == "none":
            raise _error(
                "null_needs_permutations",
                f"permutations ({permutations}) count the shuffles of the permutation null; "
                "use null 'permutation' or permutations 0",
            )
        if permutations:  # the default asks for the analytic null; a count asks for shuffles
            return "permutation"
        if value == "permutation":
            raise _error(
                "null_needs_permutations",
                "the permutation null needs permutations of at least 1",
            )
        if value == "analytic" and mode == "full":
            return "none"  # the analytic null sums per-batch moments; full mode has no batches
        return value

    @classmethod
    def build(cls, options: CompareOptions | None = None, /, **changes: Any) -> CompareOptions:
        """``options`` (default: every default) with ``changes``, validated together.

        An unknown option name is a :class:`TypeError`, as for any keyword argument; an
        invalid value an :class:`OptionsError`.
        """
        unknown = sorted(set(changes) - set(cls.model_fields))
        if unknown:
            raise TypeError(
                f"unknown comparison option {', '.join(map(repr, unknown))}; the options are "
                f"{', '.join(cls.model_fields)}"
            )
        if options is not None and not changes:
            return options
        values = dict(options) if options is not None else {}
        try:
            return cls.model_validate(values | changes)
        except ValidationError as exc:
            raise OptionsError.from_validation(exc) from None

    def check_batches(self, batches: int) -> None:
        """Raise :class:`OptionsError` if the batch bootstrap is asked for over ``batches``
        batches, fewer than :data:`MIN_BOOTSTRAP_BATCHES`."""
        if self.interval == "batches":
            check_bootstrap_batches(batches)

    @property
    def unused(self) -> frozenset[str]:
        """The options whose value changes nothing given the others: ``resamples`` without the
        batch bootstrap, ``random_init_draws`` without the random-init baseline, ``knn_k``
        without ``mutual_knn`` (what a list of a comparison's chosen options leaves out)."""
        unused = set()
        if self.interval != "batches":
            unused.add("resamples")
        if "random_init" not in self.baselines:
            unused.add("random_init_draws")
        if "mutual_knn" not in self.measures:
            unused.add("knn_k")
        return frozenset(unused)

    @property
    def whole_sample(self) -> tuple[str, ...]:
        """The measures that need every image's features at once (all but ``cka``)."""
        return tuple(m for m in self.measures if m != "cka")

    def check_memory(self, n: int, widths: list[int], itemsize: int = 4) -> None:
        """Raise :class:`OptionsError` if the whole-sample measures over ``n`` images of layers
        of ``widths`` features would take more memory than their budget
        (:mod:`analysis.measures.budget`)."""
        need = estimate_bytes(n, widths, self.measures, itemsize=itemsize, k=self.knn_k)
        budget = budget_bytes()
        if need > budget:
            raise OptionsError(
                "measures",
                "over_memory_budget",
                f"measures: {', '.join(self.whole_sample)} over {n} images and "
                f"{len(widths)} layers ({sum(widths)} features) need about {gib(need)}, more "
                f"than the budget of {gib(budget)} ({BUDGET_ENV}); use fewer images or layers, "
                "or raise the budget",
            )

    @property
    def parsed_kernel(self) -> Kernel:
        """The kernel as the engine uses it."""
        return parse_kernel(self.kernel)

    @property
    def autocast(self) -> torch.dtype | None:
        """The autocast dtype of the forward pass; None for plain fp32."""
        return _AUTOCAST.get(self.dtype)


def add_switches(model: type[CompareOptions], switches: Sequence[Switch]) -> None:
    """Add the options the batch statistics bring (:class:`Switch`, each declared in its
    statistic's module) to ``model``'s fields, after its own: validated like them, and so in its
    JSON Schema, :func:`option_specs`, a service's request body, command line and form."""
    fields = model.__pydantic_fields__
    for switch in switches:
        if switch.name in fields:
            raise AnalysisError(f"the option {switch.name!r} is declared twice")
        fields[switch.name] = FieldInfo.from_annotated_attribute(
            switch.annotation,
            Field(
                default=switch.default,
                description=switch.description,
                ge=switch.minimum,
                le=switch.maximum,
            ),
        )
    if switches:
        model.model_rebuild(force=True)


add_switches(CompareOptions, SWITCHES)


@dataclass(frozen=True)
class OptionSpec:
    """One option as plain values, for a command line or a form.

    ``kind``: ``choice`` (one of ``choices``), ``choices`` (any of ``choices``, a list; a
    comma-separated string is read too), ``int`` (within ``minimum``..``maximum`` where given;
    a bound that depends on another option is in the description), ``text`` (a string checked
    by the option's validator; ``examples`` shows valid ones, ``pattern``, where given, is a
    regular expression every valid one matches), ``flag`` (a boolean) or ``layers`` (see
    :data:`Layers`). ``deprecated``: still read, superseded (its description says by what).
    """

    name: str
    kind: Literal["choice", "choices", "int", "text", "flag", "layers"]
    default: Any
    description: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    examples: tuple[Any, ...] = ()
    pattern: str | None = None
    deprecated: bool = False


def option_specs(options: type[CompareOptions] = CompareOptions) -> dict[str, OptionSpec]:
    """Every option of :class:`CompareOptions`, in field order, read from the JSON Schema of
    ``options``: CompareOptions itself, or a subclass that narrows its bounds (a service's
    request, whose other fields are not options and are left out)."""
    props: dict[str, dict[str, Any]] = options.model_json_schema()["properties"]
    specs = {}
    for name in CompareOptions.model_fields:
        prop = props[name]
        # an optional value (``int | None``): its non-null member says what it is
        members = [p for p in prop.get("anyOf", ()) if p.get("type") != "null"]
        typed = members[0] if len(members) == 1 else prop
        kind: Literal["choice", "choices", "int", "text", "flag", "layers"]
        items = typed.get("items") if typed.get("type") == "array" else None
        if "enum" in typed:
            kind = "choice"
        elif isinstance(items, dict) and "enum" in items:
            kind = "choices"
        elif typed.get("type") == "integer":
            kind = "int"
        elif typed.get("type") == "string":
            kind = "text"
        elif typed.get("type") == "boolean":
            kind = "flag"
        else:
            kind = "layers"
        choices = typed.get("enum") or (items or {}).get("enum") or ()
        specs[name] = OptionSpec(
            name=name,
            kind=kind,
            default=prop.get("default"),
            description=prop.get("description", ""),
            choices=tuple(choices),
            minimum=typed.get("minimum"),
            maximum=typed.get("maximum"),
            examples=tuple(prop.get("examples", ())),
            pattern=typed.get("pattern"),
            deprecated=bool(prop.get("deprecated")),
        )
    return specs
