"""Importing a Hugging Face / timm model folder: ``config.json`` + ``model.safetensors``.

That pair is what ``timm.models.save_for_hf(model, dir, safe_serialization=True)`` writes
and what the Hub serves for timm models. ``config.json`` names the ``architecture``, its
``num_classes`` and ``model_args`` (constructor keywords) and the ``pretrained_cfg`` whose
data config (input size, interpolation, crop, mean, std) becomes the model's pipeline.

A folder is read from a directory or a ``.zip``. Archives are never extracted wholesale:
only the two files are read, each bounded by the size its entry declares, and archives with
unsafe paths, links, too many entries or suspicious compression are refused
(:mod:`models.archives`, which dataset archives go through too). Pickle-based
weights (``pytorch_model.bin``, ``.pth``) are refused with the way to convert them.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import timm
from torch import nn

from models.archives import ArchiveError, copy_entry, open_zip, safe_entries
from models.checkpoint import load, pickle_refusal, save
from models.errors import CheckpointError
from models.preprocessing import data_config

__all__ = ["LOADER_KEYS", "HubFolder", "import_hub", "load_hub", "read_hub"]

CONFIG, WEIGHTS = "config.json", "model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
DEFAULT_MAX_BYTES = 4 << 30
MAX_MEMBERS = 1000
_PICKLE_SUFFIXES = (".bin", ".pth", ".pt", ".ckpt", ".pkl")
# Constructor keywords that would load weights from elsewhere or download them.
LOADER_KEYS = frozenset(
    {"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir"}
)


@dataclass
class HubFolder:
    """The parsed ``config.json`` and the path of the weights, ready to build."""

    config: dict[str, Any]
    weights: Path
    name: str = "the model folder"  # how refusals name it: its path, or the archive's name

    @property
    def architecture(self) -> str:
        return str(self.config["architecture"])

    def kwargs(self) -> dict[str, Any]:
        """Constructor keywords: ``model_args`` with the top-level ``num_classes``."""
        kw = dict(self.config.get("model_args") or {})
        if "num_classes" in self.config:
            kw.setdefault("num_classes", self.config["num_classes"])
        return kw


def _check_config(raw: bytes, where: str) -> dict[str, Any]:
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{where} is not valid JSON") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{where} must be a JSON object")
    arch = config.get("architecture")
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise CheckpointError(f"{where} names no known timm 'architecture' ({str(arch)[:100]!r})")
    args = config.get("model_args", {})
    if not isinstance(args, dict):
        raise CheckpointError(f"{where}: 'model_args' must be a JSON object")
    found = sorted(k for k in args if k in LOADER_KEYS)
    if found:
        raise CheckpointError(
            f"{where}: model_args {found} are not accepted; only the folder's weights are loaded"
        )
    nc = config.get("num_classes", 0)
    if not isinstance(nc, int) or isinstance(nc, bool) or nc < 0:
        raise CheckpointError(f"{where}: 'num_classes' must be a non-negative integer")
    cfg = config.get("pretrained_cfg", {})
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{where}: 'pretrained_cfg' must be a JSON object")
    return config


def _refuse_pickles(names: list[str], where: str) -> None:
    pickles = [n for n in names if PurePosixPath(n).suffix.lower() in _PICKLE_SUFFIXES]
    if pickles:
        raise CheckpointError(
            pickle_refusal(
                f"'{PurePosixPath(pickles[0]).name}' in {where}", f"and put it beside the {CONFIG}"
            )
        )
    raise CheckpointError(f"{where} has no {WEIGHTS} next to its {CONFIG}")


def _from_directory(root: Path) -> HubFolder:
    config, weights = root / CONFIG, root / WEIGHTS
    if not config.is_file():
        raise CheckpointError(f"{root} has no {CONFIG}; is it a Hugging Face / timm model folder?")
    if not weights.is_file():
        _refuse_pickles([p.name for p in root.iterdir()], str(root))
    if config.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{config} is larger than {MAX_CONFIG_BYTES} bytes")
    return HubFolder(_check_config(config.read_bytes(), str(config)), weights, str(root))


def _one_config(files: list[str], where: str) -> str:
    """The archive's one config.json, in the archive's root or in its one top-level folder."""
    configs = sorted(n for n in files if PurePosixPath(n).name == CONFIG)
    if not configs:
        raise CheckpointError(
            f"{where} holds no {CONFIG}; a Hugging Face / timm model folder is {CONFIG} and "
            f"{WEIGHTS}, as timm's save_for_hf(model, folder, safe_serialization=True) "
            "writes them: zip that folder"
        )
    if len(configs) > 1:
        raise CheckpointError(
            f"{where} holds {len(configs)} {CONFIG} files ({', '.join(configs[:3])}); zip "
            "one model folder at a time"
        )
    if len(PurePosixPath(configs[0]).parts) > 2:
        raise CheckpointError(
            f"{where} holds its {CONFIG} at {configs[0]}, more than one folder deep; zip the "
            "model folder itself"
        )
    return configs[0]


def _from_zip(path: Path, scratch: Path, max_bytes: int, name: str) -> HubFolder:
    where = f"'{name}'"
    archive = open_zip(path, name)
    with archive:
        files = {
            info.filename: info
            for info in safe_entries(archive, name, max_members=MAX_MEMBERS, max_bytes=max_bytes)
        }
        # the folder itself may be the archive's one top-level entry
        config_name = _one_config(list(files), where)
        prefix = str(PurePosixPath(config_name).parent)
        prefix = "" if prefix == "." else prefix + "/"
        if prefix + WEIGHTS not in files:
            _refuse_pickles(list(files), where)
        copy_entry(archive, files[config_name], name, scratch / CONFIG, MAX_CONFIG_BYTES)
        # the config is checked before the (large) weights are copied out
        config = _check_config((scratch / CONFIG).read_bytes(), f"{CONFIG} in {where}")
        copy_entry(archive, files[prefix + WEIGHTS], name, scratch / WEIGHTS, max_bytes)
    return HubFolder(config, scratch / WEIGHTS, where)


def read_hub(
    source: str | os.PathLike[str],
    scratch: str | os.PathLike[str],
    *,
    max_bytes: int = 0,
    name: str | None = None,
) -> HubFolder:
    """Parse a model folder (a directory or a ``.zip``); archive members go to ``scratch``.

    ``name``: the archive as its owner knows it (an upload's file name; default its own
    name), which every refusal names.
    """
    path = Path(source)
    if path.is_dir():
        return _from_directory(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    name = name or path.name
    if PurePosixPath(name).suffix.lower() in _PICKLE_SUFFIXES:
        raise CheckpointError(pickle_refusal(f"'{name}'", f"and zip it with the folder's {CONFIG}"))
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"'{name}' is not a zip archive; a model folder ({CONFIG} and {WEIGHTS}) is "
            "imported as a folder or as a .zip of one"
        )
    try:
        return _from_zip(path, Path(scratch), max_bytes or DEFAULT_MAX_BYTES, name)
    except ArchiveError as exc:
        raise CheckpointError(str(exc)) from None


def load_hub(folder: HubFolder) -> tuple[nn.Module, dict[str, Any]]:
    """Build the folder's architecture and load its weights strictly (safetensors only)."""
    try:
        model, meta = load(folder.weights, arch=folder.architecture, **folder.kwargs())
    except CheckpointError as exc:  # name the folder's weights, not where they were unpacked
        shown = str(exc).replace(str(folder.weights), f"{WEIGHTS} in {folder.name}")
        raise CheckpointError(shown) from exc.__cause__
    pipeline = data_config(model, pretrained_cfg=folder.config.get("pretrained_cfg") or None)
    model.atlas_preprocessing = pipeline  # type: ignore[assignment]
    meta["preprocessing"] = pipeline
    return model, meta


def import_hub(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    scratch: str | os.PathLike[str],
    *,
    max_bytes: int = 0,
    name: str | None = None,
) -> Path:
    """Convert a model folder into a cka-atlas checkpoint at ``out``; return its weights path.

    ``name``: the archive as its owner knows it (see :func:`read_hub`).

    The sidecar records the architecture, its keywords, the pipeline from the folder's data
    config, and the whole ``config.json`` under ``extra.hub_config``.
    """
    folder = read_hub(source, scratch, max_bytes=max_bytes, name=name)
    model, meta = load_hub(folder)
    return save(model, out, preprocessing=meta["preprocessing"], hub_config=folder.config)
