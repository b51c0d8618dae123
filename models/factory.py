"""``models.create``: timm's ``create_model`` with the project's errors and provenance."""

from __future__ import annotations

import json
from typing import Any

import timm
from torch import nn

from models.errors import ConfigError
from models.families import list_presets

__all__ = ["create"]


def create(name: str, *, pretrained: bool = False, **overrides: Any) -> nn.Module:
    """Build a preset or any timm architecture (untrained), e.g. ``create("mixer_digits")``.

    The model carries ``atlas_config`` = {"arch", "family", "config"}, which
    :func:`models.save` records so that :func:`models.load` can rebuild it. For timm's own
    architectures the config is the overrides given here; ``pretrained=True`` asks timm
    for its published weights (presets have none).
    """
    if not timm.is_model(name):
        raise ConfigError(
            f"unknown architecture '{name}'; presets are {', '.join(list_presets())}, "
            "and any timm model name works too"
        )
    try:
        model = timm.create_model(name, pretrained=pretrained, **overrides)
    except ConfigError:
        raise
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"cannot build {name} with options {overrides}: {exc}") from exc
    if not hasattr(model, "atlas_config"):
        try:
            config = json.loads(json.dumps(overrides))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"options {overrides} for {name} are not JSON values") from exc
        model.atlas_config = {"arch": name, "family": "timm", "config": config}  # type: ignore[assignment]
    return model
