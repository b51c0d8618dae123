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

Values are canonical once validated: the kernel is the string :func:`analysis.kernels.parse_kernel`
reads back (``"RBF:0.50"`` becomes ``"rbf:0.5"``), the dtype one of ``"fp32"``, ``"bf16"``,
``"fp16"`` (``None``, torch dtypes and the long names are read too), a list of layers a tuple.

Two options depend on others, and are checked after them (fields validate in order):
``batch_size`` must reach the estimator's smallest batch (:data:`analysis.hsic.MIN_SAMPLES`),
and ``bootstrap`` needs ``minibatch`` mode. Invalid values make the constructor raise pydantic's
``ValidationError``, each error located at its field and typed (``invalid_kernel``,
``batch_too_small``, … see :data:`ERROR_TYPES`; the rest are pydantic's own types);
:meth:`CompareOptions.build`, which :func:`analysis.compare` uses, raises :class:`OptionsError`
instead, one sentence that starts with the field's name.
"""

from __future__ import annotations

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
)
from pydantic_core import PydanticCustomError

from analysis.errors import EstimatorError
from analysis.hsic import MIN_SAMPLES, Estimator
from analysis.kernels import Kernel, parse_kernel
from analysis.layers import FeaturePolicy

__all__ = [
    "DTYPES",
    "ERROR_TYPES",
    "MAX_RANDOM_INIT_DRAWS",
    "MIN_BOOTSTRAP_BATCHES",
    "MODES",
    "NULLS",
    "CompareOptions",
    "Dtype",
    "Layers",
    "Mode",
    "NullKind",
    "OptionSpec",
    "OptionsError",
    "option_specs",
]

Mode = Literal["minibatch", "full"]
NullKind = Literal["analytic", "permutation", "none"]
NULLS: tuple[NullKind, ...] = get_args(NullKind)
MODES: tuple[Mode, ...] = get_args(Mode)
IntervalUnit = Literal["images", "batches"]
# Fewer batches than this give a batch bootstrap too few distinct resamples to mean anything.
MIN_BOOTSTRAP_BATCHES = 20
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

# The error types of this module's own checks; a service may map them to its problem codes.
ERROR_TYPES = (
    "invalid_kernel",
    "invalid_dtype",
    "invalid_layers",
    "batch_too_small",
    "bootstrap_needs_minibatch",
    "calibration_needs_minibatch",
    "null_needs_permutations",
    "too_few_batches",
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


class OptionsError(EstimatorError):
    """Options that cannot run; the message is one sentence that starts with the field name."""

    def __init__(self, field: str, kind: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.kind = kind

    @classmethod
    def from_validation(cls, exc: ValidationError) -> OptionsError:
        """The first error of ``exc`` as one sentence; how many others there were, if any."""
        errors = exc.errors(include_url=False)
        first = errors[0]
        field = ".".join(str(part) for part in first["loc"]) or "options"
        reason = first["msg"]
        if first["type"] not in ERROR_TYPES:  # pydantic's own wording: "Input should be ..."
            reason = f"{reason[:1].lower()}{reason[1:]}, not {first['input']!r}"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return cls(field, first["type"], f"{field}: {reason}{more}")


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
            "(T, a positive number, times that bandwidth)."
        ),
        examples=["linear", "rbf", "rbf:0.5"],
        json_schema_extra={"pattern": r"^(linear|rbf(:[0-9.eE+-]+)?)$"},
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
    bootstrap: int = Field(
        default=0,
        ge=0,
        description=(
            "95 % intervals per cell; 0 for none. With `interval` `images` (the default) any "
            "positive value asks for the image-level interval, which needs no resamples; with "
            "`batches`, the number of bootstrap resamples of whole batches. Needs minibatch mode."
        ),
    )
    interval: IntervalUnit = Field(
        default="images",
        description=(
            "The unit of the intervals: `images` (every image a draw: the first-order Hoeffding "
            "projection of HSIC, valid at any batch size) or `batches` (a percentile bootstrap "
            f"over whole batches, refused below {MIN_BOOTSTRAP_BATCHES} batches)."
        ),
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

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap_needs_minibatch(cls, value: int, info: ValidationInfo) -> int:
        mode = info.data.get("mode")
        if value and mode not in (None, "minibatch"):
            raise _error(
                "bootstrap_needs_minibatch",
                f"bootstrap intervals resample minibatches and need minibatch mode, not {mode}",
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
        if self.bootstrap and self.interval == "batches" and batches < MIN_BOOTSTRAP_BATCHES:
            raise OptionsError(
                "interval",
                "too_few_batches",
                f"interval: a bootstrap over {batches} batches has too few distinct resamples "
                f"for its percentiles to mean anything (it needs at least "
                f"{MIN_BOOTSTRAP_BATCHES}); use interval='images', or smaller batches",
            )

    @property
    def parsed_kernel(self) -> Kernel:
        """The kernel as the engine uses it."""
        return parse_kernel(self.kernel)

    @property
    def autocast(self) -> torch.dtype | None:
        """The autocast dtype of the forward pass; None for plain fp32."""
        return _AUTOCAST.get(self.dtype)


@dataclass(frozen=True)
class OptionSpec:
    """One option as plain values, for a command line or a form.

    ``kind``: ``choice`` (one of ``choices``), ``int`` (within ``minimum``..``maximum`` where
    given; a bound that depends on another option is in the description), ``text`` (a string
    checked by the option's validator; ``examples`` shows valid ones), ``flag`` (a boolean) or
    ``layers`` (see :data:`Layers`).
    """

    name: str
    kind: Literal["choice", "int", "text", "flag", "layers"]
    default: Any
    description: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    examples: tuple[Any, ...] = ()


def option_specs() -> dict[str, OptionSpec]:
    """Every option of :class:`CompareOptions`, in field order, read from its JSON Schema."""
    props: dict[str, dict[str, Any]] = CompareOptions.model_json_schema()["properties"]
    specs = {}
    for name, prop in props.items():
        kind: Literal["choice", "int", "text", "flag", "layers"]
        if "enum" in prop:
            kind = "choice"
        elif prop.get("type") == "integer":
            kind = "int"
        elif prop.get("type") == "string":
            kind = "text"
        elif prop.get("type") == "boolean":
            kind = "flag"
        else:
            kind = "layers"
        specs[name] = OptionSpec(
            name=name,
            kind=kind,
            default=prop.get("default"),
            description=prop.get("description", ""),
            choices=tuple(prop.get("enum", ())),
            minimum=prop.get("minimum"),
            maximum=prop.get("maximum"),
            examples=tuple(prop.get("examples", ())),
        )
    return specs
