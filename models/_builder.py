"""Shared plumbing for the families' factories: validated config, seeded construction, timm cfgs.

Every preset entrypoint follows the same path: merge the caller's overrides into the preset's
defaults (the *config*, a JSON-able dict that fully determines the architecture), translate the
config into constructor kwargs, build the module with timm's ``build_model_with_cfg`` while the
global RNG is seeded from ``config["seed"]``, and attach ``model.atlas_config`` so that
:func:`models.save` can write a sidecar from which :func:`models.load` rebuilds the model.

Seeding construction makes a preset a pure function of its config: two calls with the same
config give bit-identical initial weights, masks and permutations, whatever the caller's RNG.

A family declares its presets once, as a :class:`Presets` table (at the sizes every family
shares, :data:`DIGITS` and :data:`CIFAR`), which gives each preset its timm entrypoint and cfg
and the family record its name, options and presets.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
from pydantic import BaseModel
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from models.errors import ConfigError
from models.families import Family
from models.schema import check_options

__all__ = [
    "CIFAR",
    "COMMON_DEFAULTS",
    "DIGITS",
    "Presets",
    "build_preset",
    "check_divisible",
    "default_cfg",
    "seeded",
]

# Keyword arguments that timm's ``create_model`` forwards to every entrypoint; they steer timm's
# own machinery (pretrained cfg, placement) and are not part of an architecture's config.
_TIMM_PASSTHROUGH = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "device", "dtype")

# The sizes of every family's two presets. digits: 8×8×1 images cut into 2×2 patches give
# S = 16 tokens; C = 32 channels makes the effective width m = S·C = 512 and keeps a 4-block
# model trainable in seconds on a CPU. cifar: 32×32×3 images cut into 4×4 patches give S = 64
# tokens and C = 64 channels, the S = C = 64 of the paper's CKA experiment; 8 blocks is Mixer-S.
DIGITS: dict[str, Any] = {
    "img_size": 8,
    "in_chans": 1,
    "patch_size": 2,
    "embed_dim": 32,
    "num_blocks": 4,
}
CIFAR: dict[str, Any] = {
    "img_size": 32,
    "in_chans": 3,
    "patch_size": 4,
    "embed_dim": 64,
    "num_blocks": 8,
}

# Defaults of :class:`models.schema.CommonOptions` (sized for digits); a family adds its own
# options to them (``{**COMMON_DEFAULTS, "mlp_ratio": 2.0}``).
COMMON_DEFAULTS: dict[str, Any] = {
    **DIGITS,
    "num_classes": 10,
    "drop_rate": 0.0,
    "proj_drop_rate": 0.0,
    "drop_path_rate": 0.0,
    "seed": 0,
}


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


@dataclass(frozen=True)
class Presets:
    """A family's two presets, ``{name}_digits`` and ``{name}_cifar``, and how timm builds them.

    ``options`` is the schema of their configs: ``defaults`` (sized for digits) at
    :data:`DIGITS`' sizes, and at :data:`CIFAR`'s with the cifar preset's own ``cifar`` options
    over them. ``translate(variant, config)`` turns a validated config into ``model_cls``
    kwargs (see :func:`build_preset`). A family module registers the table with timm
    (:meth:`register_with_timm`) and its :class:`Family` record, whose name, options and
    presets are the table's (:meth:`family`); a family built like another one derives its
    table from that one's (``dataclasses.replace``).
    """

    name: str
    options: type[BaseModel]
    model_cls: Callable[..., nn.Module]
    translate: Callable[[str, dict[str, Any]], dict[str, Any]]
    defaults: Mapping[str, Any]
    cifar: Mapping[str, Any] = field(default_factory=dict)

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        """Each preset's default config, by name."""
        return {
            f"{self.name}_digits": {**self.defaults, **DIGITS},
            f"{self.name}_cifar": {**self.defaults, **CIFAR, **self.cifar},
        }

    def create(self, variant: str, pretrained: bool, kwargs: dict[str, Any]) -> nn.Module:
        """Preset ``variant`` with the caller's ``kwargs`` over its defaults."""
        return build_preset(
            variant,
            self.name,
            self.model_cls,
            self.configs[variant],
            kwargs,
            partial(self.translate, variant),
            pretrained=pretrained,
        )

    def register_with_timm(self, module: str, **docs: str) -> None:
        """Give each preset a timm entrypoint in ``module``, documented by ``docs[preset]``.

        The entrypoint ``preset(pretrained=False, **kwargs)`` becomes an attribute of the
        module, as a hand-written ``@register_model`` function would be, and the module's
        ``default_cfgs`` gains the presets' cfgs first, where ``register_model`` looks them up.
        """
        if set(docs) != set(self.configs):
            raise ValueError(f"docs for {sorted(docs)}, presets are {sorted(self.configs)}")
        namespace = sys.modules[module]
        namespace.default_cfgs = {  # type: ignore[attr-defined]
            **getattr(namespace, "default_cfgs", {}),
            **generate_default_cfgs({name: _timm_cfg(c) for name, c in self.configs.items()}),
        }
        for name, doc in docs.items():
            entrypoint = self._entrypoint(name)
            entrypoint.__name__ = entrypoint.__qualname__ = name
            entrypoint.__module__, entrypoint.__doc__ = module, doc
            setattr(namespace, name, register_model(entrypoint))

    def _entrypoint(self, variant: str) -> Callable[..., nn.Module]:
        def entrypoint(pretrained: bool = False, **kwargs: Any) -> nn.Module:
            return self.create(variant, pretrained, kwargs)

        return entrypoint

    def family(self, like: Family | None = None, **fields: Any) -> Family:
        """The :class:`Family` of these presets: this table's name, options and configs, and
        ``fields`` (recipe, checks, Ω, grid, rank) over those of the family it is ``like``."""
        table: dict[str, Any] = {
            "name": self.name,
            "options": self.options,
            "presets": self.configs,
        }
        if like is None:
            return Family(**table, **fields)
        return replace(like, **table, **fields)


def _timm_cfg(config: Mapping[str, Any]) -> dict[str, Any]:
    """The timm cfg of a preset: its input size and classes."""
    size = (config["in_chans"], config["img_size"], config["img_size"])
    return default_cfg(size, config["num_classes"])
