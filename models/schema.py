"""Option validation for every family: strict types, ranges, then the family's checks across keys.

Each family declares a pydantic model of its options in its own module (most extend
:class:`CommonOptions`) and registers it (:mod:`models.families`); a preset's defaults fill
what the caller leaves out. Validation is strict about types (``1.5`` is not an ``int``,
``true`` not a number, ``"3"`` not either; an ``int`` is accepted where a float is expected)
and runs once, in :func:`check_options`, which :func:`models.create` (through
``build_preset``) and :func:`models.validate_config` both call.

Every option has a maximum, so a request cannot ask for a model that does not fit any machine.
Checks that span keys (patches tile the image, hidden widths are whole numbers) follow the
per-key ones and are the family's own (:func:`whole` and :func:`tokens` help write them).
Every failure is a :class:`ConfigError` whose one sentence names the offending key. ``depth``
is accepted as another name for ``num_blocks``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.errors import ConfigError
from models.families import family

__all__ = [
    "ALIASES",
    "CommonOptions",
    "check_options",
    "describe_options",
    "family_schema",
    "tokens",
    "whole",
]

# Other names a user may write for an option; the stored config uses the canonical one.
ALIASES = {"depth": "num_blocks"}

# Maxima shared by the families: far above any experiment the project runs (cifar uses 32-pixel
# images, C = 64, 8 blocks, γ = 4), far below what would not fit a machine.
MAX_IMG_SIZE = 4096
MAX_EMBED_DIM = 8192
MAX_BLOCKS = 256
MAX_CLASSES = 100_000
MAX_EXPANSION = 64.0


class CommonOptions(BaseModel):
    """Options the Mixer-style families share: input, patching, sizes, regularisation, seed."""

    model_config = ConfigDict(extra="forbid", strict=True)

    img_size: int = Field(
        ge=1, le=MAX_IMG_SIZE, description="side of the square input image, in pixels"
    )
    in_chans: int = Field(ge=1, le=4, description="channels of the input image")
    num_classes: int = Field(ge=1, le=MAX_CLASSES, description="classes of the classifier head")
    patch_size: int = Field(
        ge=1, le=MAX_IMG_SIZE, description="side of a square patch; must divide img_size"
    )
    embed_dim: int = Field(ge=1, le=MAX_EMBED_DIM, description="channels C of each token")
    num_blocks: int = Field(
        ge=1, le=MAX_BLOCKS, description="depth: the number of blocks (alias depth)"
    )
    drop_rate: float = Field(ge=0.0, lt=1.0, description="dropout before the head")
    proj_drop_rate: float = Field(ge=0.0, lt=1.0, description="dropout inside the blocks' MLPs")
    drop_path_rate: float = Field(ge=0.0, lt=1.0, description="stochastic depth rate")
    seed: int = Field(
        ge=0, le=2**63 - 1, description="seed of the initial weights, masks and permutations"
    )


def family_schema(name: str) -> type[BaseModel]:
    """The pydantic model of family ``name``'s options."""
    return family(name).options


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
    variant: str, schema: type[BaseModel], exc: ValidationError, given: Mapping[str, Any]
) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "?"
    key = next((a for a, k in ALIASES.items() if k == key and a in given), key)
    if error["type"] == "extra_forbidden":
        known = ", ".join(schema.model_fields)
        return f"unknown option '{key}' for {variant}; known options are {known}"
    message = error["msg"][:1].lower() + error["msg"][1:]
    return f"option '{key}' of {variant}: {message} (got {error['input']!r})"


def whole(variant: str, key: str, value: float, what: str, even: bool = False) -> int:
    """``value`` (hidden width ``what``, derived from option ``key``) as a positive whole number."""
    if value != int(value) or value < 1 or (even and int(value) % 2):
        kind = "an even whole number" if even else "a positive whole number"
        raise ConfigError(f"option '{key}' of {variant}: {what} {value:g} must be {kind}")
    return int(value)


def tokens(variant: str, config: Mapping[str, Any]) -> int:
    """S: the tokens of the square image under the config's patching (patches must tile it)."""
    img, patch = config["img_size"], config["patch_size"]
    if img % patch:
        raise ConfigError(
            f"option 'patch_size' of {variant}: {patch} does not divide img_size {img}"
        )
    return int((img // patch) ** 2)


def check_options(
    variant: str, family_name: str, defaults: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """``given`` over ``defaults``, validated: the full, explicit, JSON-able config.

    The family's own checks run after the per-key ones and may fill defaults that depend on
    other options (the SW-MLP's unset density), so a stored config never depends on a
    default that might change.
    """
    owner = family(family_name)
    merged = {**defaults, **_canonical(variant, given)}
    try:
        config = owner.options.model_validate(merged).model_dump()
    except ValidationError as exc:
        raise ConfigError(_sentence(variant, owner.options, exc, given)) from None
    config = owner.check(variant, config)
    normalised: dict[str, Any] = json.loads(json.dumps(config))  # JSON values only
    return normalised


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
