"""``/v1/architectures``: our presets and the timm families the service can build."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

from fastapi import Query

from analysis.layers import default_layers
from app.http.api.deps import Paging, api_router, not_found
from app.http.schemas import NO_NUL, ArchitectureOut, Page
from app.http.security import READ
from app.jobs.submit import skeleton

__all__ = ["router"]

router = api_router("architectures")

# timm families that are MLP-style vision networks with the stem/blocks/norm/head layout.
TIMM_PATTERNS = ("mixer_*", "gmlp_*", "resmlp_*")


@cache
def _names() -> tuple[tuple[str, str], ...]:
    import timm

    import models

    presets = [(n, "preset") for n in models.list_presets()]
    timm_names = sorted({n for p in TIMM_PATTERNS for n in timm.list_models(p)})
    return tuple(presets + [(n, "timm") for n in timm_names if n not in dict(presets)])


@cache
def _describe(name: str, family: str) -> dict[str, Any]:
    import models

    out: dict[str, Any] = {"name": name, "family": family}
    try:
        net = skeleton(name, {})
        spec = models.input_spec(net)
        out["input_shape"] = [spec.channels, spec.height, spec.width]
        out["num_classes"] = spec.num_classes
        out["default_layers"] = default_layers(net)
    except Exception:  # an architecture that cannot be described still gets listed
        pass
    return out


@router.get("", response_model=Page[ArchitectureOut], **READ)
def list_architectures(
    at: Paging,
    family: str | None = Query(None, pattern="^(preset|timm)$"),
    q: Annotated[
        str | None, Query(max_length=200, description="Substring of the name"), NO_NUL
    ] = None,
) -> dict[str, Any]:
    """Presets and timm names; presets come first. Default layers are computed per page."""
    names = [(n, f) for n, f in _names() if (family is None or f == family) and (not q or q in n)]
    items = [_describe(n, f) for n, f in names[at.offset : at.offset + at.limit]]
    return at.answer(items, len(names))


@router.get("/{name}", response_model=ArchitectureOut, **READ)
def get_architecture(name: str) -> dict[str, Any]:
    family = dict(_names()).get(name)
    if family is None:
        raise not_found("architecture", repr(name[:100]))
    return _describe(name, family)
