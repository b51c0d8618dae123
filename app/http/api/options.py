"""A comparison's options as its lists show them: the ones that differ from the defaults, and
the ``option=NAME=VALUE`` filters that select comparisons by them.

Nothing here lists an option by hand. The options, their kinds, choices and defaults are read
from their one definition, :class:`analysis.CompareOptions` (a request,
:class:`app.jobs.requests.ComparisonIn`, is one plus its models and dataset). An option added
there is shown and filterable here without a change. A default that depends on
other options (``null`` is ``none`` in full mode and ``permutation`` with permutations) is
taken in the comparison's context, so a comparison shows only what its request chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from analysis.options import CompareOptions
from app.http.problems import ProblemError
from app.store.repository import ParamFilter

__all__ = ["Option", "differing_options", "option_filter", "option_suggestions", "options"]

Kind = Literal["choice", "int", "float", "flag", "text", "list", "layers"]
# Where the options come from, first definition first.
SOURCES: tuple[type[BaseModel], ...] = (CompareOptions,)


@dataclass(frozen=True)
class Option:
    """One option as a filter reads it: its kind, default and allowed values."""

    name: str
    kind: Kind
    default: Any
    choices: tuple[str, ...] = ()


def _kind(prop: dict[str, Any]) -> tuple[Kind, tuple[str, ...]]:
    if "enum" in prop:
        return "choice", tuple(prop["enum"])
    kinds: dict[str, Kind] = {"integer": "int", "number": "float", "boolean": "flag"}
    if prop.get("type") in kinds:
        return kinds[prop["type"]], ()
    if prop.get("type") == "string":
        return "text", ()
    if prop.get("type") == "array":
        return "list", tuple(prop.get("items", {}).get("enum", ()))
    return "layers", ()  # a union: a name, an index, a list, a mapping


@cache
def options() -> dict[str, Option]:
    """Every comparison option, by name, in the order of their definitions."""
    found: dict[str, Option] = {}
    for source in SOURCES:
        props = source.model_json_schema()["properties"]
        for name, field in source.model_fields.items():
            if name in found or name not in props or props[name].get("deprecated"):
                continue  # a deprecated option (bootstrap) is read into others, never kept
            kind, choices = _kind(props[name])
            default = field.get_default(call_default_factory=True)
            if isinstance(default, tuple):  # as stored params (JSON) hold it
                default = list(default)
            found[name] = Option(name, kind, default, choices)
    return found


def _in_context(name: str, chosen: Mapping[str, Any]) -> Any:
    """The default of CompareOptions' option ``name`` given the other ``chosen`` options."""
    known = CompareOptions.model_fields
    others = {k: v for k, v in chosen.items() if k in known and k != name}
    try:
        return getattr(CompareOptions.model_validate(others), name)
    except ValidationError:  # options stored by an older release: the plain default
        return options()[name].default


def differing_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """The options in a comparison's ``params`` that are not their defaults, in option order.

    An option the comparison does not record, records as None, or does not use given the others
    (:attr:`CompareOptions.unused`: the demo's ``resamples`` with image intervals) is not shown.
    """
    known = options()
    chosen = {k: params[k] for k in known if params.get(k) is not None}
    differ = {k: v for k, v in chosen.items() if v != known[k].default}
    for name in _unused(chosen):
        differ.pop(name, None)
    for name in [k for k in differ if k in CompareOptions.model_fields]:
        default = _in_context(name, chosen)
        if differ[name] == default:
            del differ[name]
    return differ


def _unused(chosen: Mapping[str, Any]) -> frozenset[str]:
    """:attr:`CompareOptions.unused` of stored options (none for options of an older release
    that no longer validate)."""
    known = CompareOptions.model_fields
    try:
        return CompareOptions.model_validate({k: v for k, v in chosen.items() if k in known}).unused
    except ValidationError:
        return frozenset()


def _refuse(detail: str) -> ProblemError:
    return ProblemError(422, "validation_error", detail, field="option")


def _parse(option: Option, text: str) -> Any:
    if option.kind == "int":
        try:
            return int(text)
        except ValueError:
            raise _refuse(f"option {option.name} is an integer, not {text!r}") from None
    if option.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise _refuse(f"option {option.name} is a number, not {text!r}") from None
    if option.kind == "flag":
        if text.lower() not in ("true", "false"):
            raise _refuse(f"option {option.name} is true or false, not {text!r}")
        return text.lower() == "true"
    if option.choices and text not in option.choices:
        raise _refuse(f"option {option.name} is one of {', '.join(option.choices)}, not {text!r}")
    if option.kind == "layers":  # an index is stored as a JSON integer
        return int(text) if text.lstrip("-").isdigit() else text
    return text


def option_filter(text: str) -> ParamFilter:
    """``NAME=VALUE`` as a filter on stored comparisons: a list option (the baselines) or the
    layer selection matches when it holds VALUE, any other when it is VALUE; a default value
    also matches comparisons stored before the option existed. 422 ``validation_error`` on
    ``option`` for an unknown option or a value it cannot take."""
    name, sep, raw = text.partition("=")
    known = options()
    if not sep or name.strip() not in known:
        raise _refuse(
            f"option filters read NAME=VALUE with NAME one of {', '.join(known)}, not {text!r}"
        )
    option = known[name.strip()]
    value = _parse(option, raw.strip())
    contains = option.kind in ("list", "layers")
    return ParamFilter(
        option.name,
        value,
        contains=contains,
        or_absent=not contains and value == option.default,
    )


def option_suggestions() -> list[str]:
    """``NAME=VALUE`` for every value an option with choices can take that is not its
    default, and ``NAME=true`` for a flag: what a filter box offers."""
    out = []
    for option in options().values():
        if option.kind == "flag":
            out.append(f"{option.name}={str(not option.default).lower()}")
        out += [f"{option.name}={c}" for c in option.choices if c != option.default]
    return out
