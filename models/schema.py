"""The declared options of every preset family: keys, types, ranges, and the checks across keys.

One pydantic model per family lists what a preset accepts; a preset's defaults (its ``DIGITS``
or ``CIFAR`` sizes over the family's defaults) fill what the caller leaves out. Validation is
strict about types (``1.5`` is not an ``int``, ``true`` not a number, ``"3"`` not either; an
``int`` is accepted where a float is expected) and runs once, in :func:`check_options`, which
:func:`models.create` (through ``build_preset``) and :func:`models.validate_config` both call.

Checks that span keys (patches tile the image, hidden widths are whole numbers, the gMLP's
gate splits evenly) follow the per-key ones. Every failure is a :class:`ConfigError` whose one
sentence names the offending key. ``depth`` is accepted as another name for ``num_blocks``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.errors import ConfigError

__all__ = ["ALIASES", "FAMILY_SCHEMAS", "check_options", "describe_options", "family_schema"]

# Other names a user may write for an option; the stored config uses the canonical one.
ALIASES = {"depth": "num_blocks"}


class _Common(BaseModel):
    """Options every preset family shares: input, patching, sizes, regularisation, seed."""

    model_config = ConfigDict(extra="forbid", strict=True)

    img_size: int = Field(ge=1, description="side of the square input image, in pixels")
    in_chans: int = Field(ge=1, description="channels of the input image")
    num_classes: int = Field(ge=1, description="classes of the classifier head")
    patch_size: int = Field(ge=1, description="side of a square patch; must divide img_size")
    embed_dim: int = Field(ge=1, description="channels C of each token")
    num_blocks: int = Field(ge=1, description="depth: the number of blocks (alias depth)")
    drop_rate: float = Field(ge=0.0, lt=1.0, description="dropout before the head")
    proj_drop_rate: float = Field(ge=0.0, lt=1.0, description="dropout inside the blocks' MLPs")
    drop_path_rate: float = Field(ge=0.0, lt=1.0, description="stochastic depth rate")
    seed: int = Field(ge=0, description="seed of the initial weights, masks and permutations")


class MixerOptions(_Common):
    """MLP-Mixer and RP-Mixer: expansions relative to S (tokens) and C (channels)."""

    token_expansion: float = Field(
        gt=0.0, description="γt: token-mixing hidden width over S; γt·S must be whole"
    )
    channel_expansion: float = Field(
        gt=0.0, description="γc: channel-mixing hidden width over C; γc·C must be whole"
    )


class GmlpOptions(_Common):
    """gMLP: one expansion γ of C, split in half by the spatial gate."""

    mlp_ratio: float = Field(gt=0.0, description="γ: hidden width over C; γ·C must be even")


class SwMlpOptions(_Common):
    """SW-MLP: expansion of the width m = S·C and the density of its weight masks."""

    mlp_ratio: float = Field(gt=0.0, description="γ: hidden width over m = S·C; γ·m must be whole")
    density: float | None = Field(
        gt=0.0,
        le=1.0,
        description="p: share of non-zero weights; unset means (1/S + 1/C)/2, the Mixer's Ω",
    )


class MlpOptions(_Common):
    """Dense MLP: the SW-MLP block at density 1 (use an ``sw_mlp_*`` preset for p < 1)."""

    mlp_ratio: float = Field(gt=0.0, description="γ: hidden width over m = S·C; γ·m must be whole")
    density: float = Field(ge=1.0, le=1.0, description="always 1: every weight is a connection")


FAMILY_SCHEMAS: dict[str, type[_Common]] = {
    "mixer": MixerOptions,
    "rp_mixer": MixerOptions,
    "gmlp": GmlpOptions,
    "sw_mlp": SwMlpOptions,
    "mlp": MlpOptions,
}


def family_schema(family: str) -> type[_Common]:
    """The pydantic model of ``family``'s options."""
    if family not in FAMILY_SCHEMAS:
        raise ConfigError(f"family '{family}' has no declared options")
    return FAMILY_SCHEMAS[family]


def _canonical(variant: str, given: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(given)
    for alias, key in ALIASES.items():
        if alias in out:
            if key in out:
                raise ConfigError(
                    f"{variant}: give either '{key}' or its alias '{alias}', not both"
                )
            out[key] = out.pop(alias)
    return out


def _sentence(
    variant: str, schema: type[_Common], exc: ValidationError, given: Mapping[str, Any]
) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "?"
    key = next((a for a, k in ALIASES.items() if k == key and a in given), key)
    if error["type"] == "extra_forbidden":
        known = ", ".join(schema.model_fields)
        return f"unknown option '{key}' for {variant}; known options are {known}"
    message = error["msg"][:1].lower() + error["msg"][1:]
    return f"option '{key}' of {variant}: {message} (got {error['input']!r})"


def _whole(variant: str, key: str, value: float, what: str, even: bool = False) -> int:
    if value != int(value) or value < 1 or (even and int(value) % 2):
        kind = "an even whole number" if even else "a positive whole number"
        raise ConfigError(f"option '{key}' of {variant}: {what} {value:g} must be {kind}")
    return int(value)


def _tokens(variant: str, config: Mapping[str, Any]) -> int:
    img, patch = config["img_size"], config["patch_size"]
    if img % patch:
        raise ConfigError(
            f"option 'patch_size' of {variant}: {patch} does not divide img_size {img}"
        )
    return int((img // patch) ** 2)


def check_options(
    variant: str, family: str, defaults: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """``given`` over ``defaults``, validated: the full, explicit, JSON-able config.

    The SW-MLP's unset density becomes (1/S + 1/C)/2, so a stored config never depends on a
    default that might change.
    """
    schema = family_schema(family)
    merged = {**defaults, **_canonical(variant, given)}
    try:
        config = schema.model_validate(merged).model_dump()
    except ValidationError as exc:
        raise ConfigError(_sentence(variant, schema, exc, given)) from None
    tokens = _tokens(variant, config)
    dim = config["embed_dim"]
    if family in ("mixer", "rp_mixer"):
        _whole(variant, "token_expansion", config["token_expansion"] * tokens, "γt·S")
        _whole(variant, "channel_expansion", config["channel_expansion"] * dim, "γc·C")
    elif family == "gmlp":
        _whole(variant, "mlp_ratio", config["mlp_ratio"] * dim, "γ·C", even=True)
    else:
        _whole(variant, "mlp_ratio", config["mlp_ratio"] * tokens * dim, "γ·m")
        if config["density"] is None:
            config["density"] = (1.0 / tokens + 1.0 / dim) / 2.0
    return json.loads(json.dumps(config))


def _range(metadata: list[Any]) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    for item in metadata:
        for cls, name in ((Ge, "ge"), (Gt, "gt"), (Le, "le"), (Lt, "lt")):
            if isinstance(item, cls):
                bounds[name] = getattr(item, name)
    return bounds


def _type(annotation: Any) -> tuple[str, bool]:
    text = getattr(annotation, "__name__", None) or str(annotation)
    nullable = "None" in str(annotation)
    if nullable:
        text = str(annotation).replace(" | None", "").replace("None | ", "")
    return text, nullable


def describe_options(family: str, defaults: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per option: key, type, nullable, default, range (ge/gt/le/lt), description.

    The CLI's ``--set KEY=VALUE``, a REST ``config`` object and a web form can be generated
    from this list; :func:`check_options` is what enforces it.
    """
    entries = []
    for key, field in family_schema(family).model_fields.items():
        kind, nullable = _type(field.annotation)
        entries.append(
            {
                "key": key,
                "type": kind,
                "nullable": nullable,
                "default": defaults.get(key),
                "range": _range(list(field.metadata)),
                "description": field.description or "",
                "aliases": sorted(a for a, k in ALIASES.items() if k == key),
            }
        )
    return entries
