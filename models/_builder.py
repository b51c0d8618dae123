"""Shared plumbing for the families' factories: validated config, seeded construction, timm cfgs.

Every preset entrypoint follows the same path: merge the caller's overrides into the preset's
defaults (the *config*, a JSON-able dict that fully determines the architecture), translate the
config into constructor kwargs, build the module with timm's ``build_model_with_cfg`` while the
global RNG is seeded from ``config["seed"]``, and attach ``model.atlas_config`` so that
:func:`models.save` can write a sidecar from which :func:`models.load` rebuilds the model.

Seeding construction makes a preset a pure function of its config: two calls with the same
config give bit-identical initial weights, masks and permutations, whatever the caller's RNG.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from timm.models import build_model_with_cfg
from torch import nn

from models.errors import ConfigError
from models.schema import check_options

__all__ = ["build_preset", "check_divisible", "default_cfg", "seeded"]

# Keyword arguments that timm's ``create_model`` forwards to every entrypoint; they steer timm's
# own machinery (pretrained cfg, placement) and are not part of an architecture's config.
_TIMM_PASSTHROUGH = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "device", "dtype")


def default_cfg(input_size: tuple[int, int, int], num_classes: int = 10) -> dict[str, Any]:
    """A timm pretrained cfg for an untrained preset.

    Presets consume pixels in [0, 1] as :class:`analysis.ImageDataset` stores them, so the
    normalisation recorded here (and in every checkpoint sidecar) is the identity.
    """
    channels = input_size[0]
    return {
        "url": "",
        "num_classes": num_classes,
        "input_size": input_size,
        "pool_size": None,
        "crop_pct": 1.0,
        "interpolation": "bilinear",
        "fixed_input_size": True,
        "mean": (0.0,) * channels,
        "std": (1.0,) * channels,
        "first_conv": "stem.proj",
        "classifier": "head",
        "license": "mit",
    }


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU RNG for the duration of the block, restoring the caller's state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_preset(
    variant: str,
    family: str,
    model_cls: Callable[..., nn.Module],
    defaults: Mapping[str, Any],
    kwargs: dict[str, Any],
    translate: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    pretrained: bool = False,
    feature_cfg: Mapping[str, Any] | None = None,
) -> nn.Module:
    """Build ``variant`` of ``family`` from its defaults overridden by ``kwargs``.

    ``translate`` turns the config into ``model_cls`` kwargs (for instance expansion factors
    relative to S into timm's ``mlp_ratio`` relative to C). The config is validated against
    the family's declared options (:mod:`models.schema`), which also fills options whose
    default depends on others (the SW-MLP density), so the stored config is explicit.
    """
    if pretrained:
        raise ConfigError(f"{variant} has no pretrained weights; train it or load a checkpoint")
    passthrough = {k: kwargs.pop(k) for k in _TIMM_PASSTHROUGH if k in kwargs}
    config = check_options(variant, family, defaults, kwargs)
    model_kwargs = translate(dict(config))
    with seeded(int(config["seed"])):
        model = build_model_with_cfg(
            model_cls,
            variant,
            pretrained=False,
            feature_cfg=dict(feature_cfg or {"feature_cls": "getter"}),
            **passthrough,
            **model_kwargs,
        )
    model.atlas_config = {"arch": variant, "family": family, "config": config}  # type: ignore[assignment]
    return model


def check_divisible(variant: str, img_size: int, patch_size: int) -> int:
    """Number of tokens S for a square image, or a config error if patches do not tile it."""
    if img_size <= 0 or patch_size <= 0 or img_size % patch_size:
        raise ConfigError(
            f"{variant}: img_size {img_size} is not a positive multiple of patch_size {patch_size}"
        )
    return (img_size // patch_size) ** 2
