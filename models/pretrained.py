"""Published weights from an operator's directory, never from the network.

``create_pretrained("mixer_b16_224", directory)`` builds timm's architecture and loads its
weights from ``directory/mixer_b16_224.safetensors`` or, failing that, from a Hugging Face
cache in ``directory`` (``hub/`` inside it or the directory itself) read strictly offline:
only files already there are opened, and nothing is downloaded. timm's own loader adapts the
weights as for a download (a different ``num_classes`` drops the classifier).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import timm
from torch import nn

from models.errors import CheckpointError, ConfigError
from models.factory import create

__all__ = ["create_pretrained", "find_pretrained"]


def _hub_ids(name: str) -> list[str]:
    """The Hub repositories timm would download ``name``'s weights from (none for presets)."""
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except (RuntimeError, ValueError):
        return []
    ids = [getattr(cfg, "hf_hub_id", None)] if cfg is not None else []
    return [i for i in ids if isinstance(i, str) and i]


def _places(name: str, directory: Path) -> list[str]:
    return [str(directory / f"{name}.safetensors")] + [
        f"the Hugging Face cache in {directory} ({repo}/model.safetensors)"
        for repo in _hub_ids(name)
    ]


def find_pretrained(name: str, directory: str | os.PathLike[str]) -> Path:
    """The safetensors file of ``name``'s weights in ``directory``; a sentence if absent."""
    root = Path(directory)
    if "/" in name or "\\" in name or name.startswith("."):
        raise ConfigError(f"{name[:100]!r} is not a timm model name")
    direct = root / f"{name}.safetensors"
    if direct.is_file():
        return direct
    from huggingface_hub import try_to_load_from_cache  # reads the cache, never the network

    for repo in _hub_ids(name):
        for cache in (root / "hub", root):
            found = try_to_load_from_cache(repo, "model.safetensors", cache_dir=str(cache))
            if isinstance(found, str) and Path(found).is_file():
                return Path(found)
    raise CheckpointError(
        f"no pretrained weights for {name}: looked for {' and '.join(_places(name, root))}; "
        "nothing is downloaded, so an operator must place them there"
    )


def create_pretrained(
    name: str, directory: str | os.PathLike[str] | None, **overrides: Any
) -> nn.Module:
    """``name`` with the weights found by :func:`find_pretrained` loaded (offline)."""
    if directory is None:
        raise CheckpointError(
            "pretrained weights are only read from a local directory (CKA_PRETRAINED_DIR, "
            "or pretrained_dir=), and none is set; nothing is downloaded"
        )
    if not timm.is_model(name):
        raise ConfigError(f"unknown architecture '{name}'")
    path = find_pretrained(name, directory)
    overlay = {"file": str(path), "source": "timm", "url": "", "hf_hub_id": None}
    try:
        model = create(name, pretrained=True, pretrained_cfg_overlay=overlay, **overrides)
    except ConfigError:
        raise
    except (RuntimeError, KeyError, OSError) as exc:  # keys/shapes or an unreadable file
        raise CheckpointError(f"{path} does not hold {name}'s weights ({exc})") from exc
    atlas: dict[str, Any] = dict(getattr(model, "atlas_config", {}))
    atlas["config"] = {
        k: v for k, v in atlas.get("config", {}).items() if k != "pretrained_cfg_overlay"
    }
    model.atlas_config = atlas  # type: ignore[assignment]
    return model
