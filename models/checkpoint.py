"""Checkpoints: safetensors weights plus a JSON sidecar from which the model is rebuilt.

``out/mixer_digits.safetensors`` holds the state dict (parameters and persistent buffers, so
SW-MLP masks and RP-Mixer permutations travel with the weights); ``out/mixer_digits.json``
holds everything needed to rebuild and to trust it: architecture and full config, input shape,
normalisation, classes, dataset identity, metrics, seed, versions, Ω and the sha256 of the
weights file. Weights are only ever read with ``safetensors``; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zipfile
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from pathlib import Path, PurePosixPath
from typing import Any

import timm
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.connections import input_spec, parameter_count
from models.errors import CheckpointError, ConfigError
from models.factory import create
from models.families import family_of
from models.options import model_structure
from models.preprocessing import data_config
from models.preprocessing import validate as validate_pipeline
from models.sidecar import check_sidecar

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_HEADER_BYTES",
    "check_safetensors",
    "check_state_dict",
    "describe",
    "file_sha256",
    "load",
    "pickle_refusal",
    "read_sidecar",
    "save",
    "sidecar_path",
    "validate_metadata",
    "weights_path",
]

FORMAT = "cka-atlas-checkpoint"
FORMAT_VERSION = 1
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "format_version": int,
    "arch": str,
    "config": dict,
    "input_shape": list,
    "num_classes": int,
    "weights_sha256": str,
}
_KNOWN_METADATA = ("dataset", "metrics", "seed", "normalisation", "training", "preprocessing")
_SHOWN = 8  # names listed in a key-mismatch error before "and N more"
MAX_HEADER_BYTES = 64 * 1024 * 1024  # a safetensors header (tensor names, shapes, offsets)


def package_version() -> str:
    """Installed version of cka-atlas, or "0+unknown" when running from an uninstalled tree."""
    try:
        return importlib_metadata.version("cka-atlas")
    except importlib_metadata.PackageNotFoundError:
        return "0+unknown"


def weights_path(path: str | os.PathLike[str]) -> Path:
    """The .safetensors file of a checkpoint named by its weights, sidecar or stem."""
    path = Path(path)
    if path.suffix in ("", ".json"):
        return path.with_suffix(".safetensors")
    if path.suffix != ".safetensors":
        raise CheckpointError(f"checkpoint {path} must be a .safetensors file")
    return path


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The JSON sidecar next to a checkpoint's weights."""
    return weights_path(path).with_suffix(".json")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe(model: nn.Module) -> dict[str, Any]:
    """What the model is, as far as the model itself knows: the architecture part of a sidecar.

    ``structure`` holds :func:`models.structure`'s keys (family, Ω, effective width, density,
    S, C, γ), measured on the model; ``connections`` is its Ω. This is the one description of a
    model: the service stores and shows it as it is.
    """
    atlas = getattr(model, "atlas_config", None)
    if not isinstance(atlas, Mapping) or "arch" not in atlas:
        raise CheckpointError(
            "the model was not built by models.create, so its architecture cannot be recorded"
        )
    spec = input_spec(model)
    info = model_structure(model)
    return {
        "arch": atlas["arch"],
        "family": atlas.get("family", "timm"),
        "preset": atlas["arch"] if family_of(atlas["arch"]) is not None else None,
        "config": dict(atlas.get("config", {})),
        "input_shape": list(spec.shape),
        "num_classes": spec.num_classes,
        "normalisation": {"mean": list(spec.mean), "std": list(spec.std)},
        "preprocessing": data_config(model),
        "parameters": parameter_count(model),
        "free_parameters": parameter_count(model, free=True),
        "connections": info["omega"],
        "effective_width": info["effective_width"],
        "structure": info,
    }


def _dataset_record(value: Any) -> dict[str, Any] | None:
    """The ``{"name", "sha256"}`` record of the data a checkpoint was trained on, checked."""
    if value is None:
        return None
    if (
        not isinstance(value, Mapping)
        or not isinstance(value.get("name"), str)
        or not isinstance(value.get("sha256"), str)
    ):
        raise CheckpointError(
            "dataset metadata must be a record with a name and a sha256 "
            '(e.g. {"name": "digits:train", "sha256": "…"})'
        )
    return dict(value)


def save(model: nn.Module, path: str | os.PathLike[str], **metadata: Any) -> Path:
    """Write ``path`` (.safetensors) and its .json sidecar; return the weights path.

    Recognised metadata: ``dataset`` (the ``{"name", "sha256"}`` record of the training data,
    :func:`models.data.dataset_record`),
    ``metrics`` ({"train": {...}, "test": {...}}), ``seed``, ``normalisation`` (overrides the
    model's), ``training`` (hyper-parameters). Other keywords are kept under ``extra``.
    """
    target = weights_path(path)
    sidecar = describe(model)
    state = {key: value.detach() for key, value in model.state_dict().items()}
    if any(value.device.type == "meta" for value in state.values()):
        raise CheckpointError("a model on the meta device has no weights to save")
    state = {key: value.to("cpu").contiguous() for key, value in state.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    # One metadata key only: safetensors writes the metadata map in hash order, so several keys
    # would make identical weights give files (and sha256s) that differ from call to call.
    save_file(state, str(tmp), metadata={"format": FORMAT})
    os.replace(tmp, target)

    extra = {k: v for k, v in metadata.items() if k not in _KNOWN_METADATA}
    sidecar.update(
        {
            "dataset": _dataset_record(metadata.get("dataset")),
            "metrics": dict(metadata.get("metrics") or {}),
            "seed": metadata.get("seed"),
            "training": metadata.get("training"),
            "weights_file": target.name,
            "weights_sha256": file_sha256(target),
            "package_version": package_version(),
            "torch_version": torch.__version__,
            "timm_version": timm.__version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "extra": extra,
        }
    )
    if metadata.get("normalisation") is not None:
        sidecar["normalisation"] = metadata["normalisation"]
    if metadata.get("preprocessing") is not None:
        sidecar["preprocessing"] = validate_pipeline(metadata["preprocessing"])
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, **sidecar}
    try:
        text = json.dumps(document, indent=2, sort_keys=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint metadata cannot be written as JSON: {exc}") from exc
    side = target.with_suffix(".json")
    side.with_name(side.name + ".tmp").write_text(text + "\n", encoding="utf-8")
    os.replace(side.with_name(side.name + ".tmp"), side)
    return target


def validate_metadata(document: Any, *, source: str = "sidecar") -> dict[str, Any]:
    """Check a sidecar document's format, fields (:mod:`models.sidecar`) and architecture."""
    if not isinstance(document, dict):
        raise CheckpointError(f"{source} is not a JSON object")
    if document.get("format") != FORMAT:
        raise CheckpointError(f"{source} is not a cka-atlas checkpoint sidecar")
    for key, kind in _REQUIRED.items():
        if not isinstance(document.get(key), kind) or isinstance(document.get(key), bool):
            raise CheckpointError(f"{source} lacks a valid '{key}' field")
    if document["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{source} has format version {document['format_version']}, newer than the "
            f"supported {FORMAT_VERSION}; upgrade cka-atlas"
        )
    if not timm.is_model(document["arch"]):
        raise CheckpointError(f"{source} names an unknown architecture '{document['arch']}'")
    return check_sidecar(document, source=source)


def read_sidecar(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate the sidecar of a checkpoint (given by weights, sidecar or stem)."""
    side = sidecar_path(path)
    if not side.is_file():
        raise CheckpointError(f"checkpoint sidecar {side} does not exist")
    try:
        document = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint sidecar {side} is not valid JSON ({exc})") from exc
    return validate_metadata(document, source=f"checkpoint sidecar {side}")


def pickle_refusal(what: str, then: str = "") -> str:
    """The sentence that refuses a pickle-based weights file ``what`` (e.g. ``'model.pth'``)
    and says how to convert it; ``then``: what to do with the converted file."""
    return (
        f"{what} is a pickle-based PyTorch file, which cka-atlas never loads (unpickling "
        "runs code); convert it where you trust it with `sd = torch.load(path, "
        "weights_only=True)` then `safetensors.torch.save_file(sd, 'model.safetensors')`"
        + (f", {then}" if then else "")
    )


def _zip_refusal(path: Path, what: str) -> str:
    """Why a zip archive is no safetensors file: torch.save's archive (a pickle inside), a
    zipped model folder, or some other zip. Only the archive's directory is read."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [PurePosixPath(n).name for n in archive.namelist()[:10_000]]
    except (OSError, zipfile.BadZipFile):
        names = []
    if "data.pkl" in names:  # torch.save writes <name>/data.pkl beside the tensor data
        return pickle_refusal(what, "and use that")
    if "config.json" in names:
        return (
            f"{what} is a zipped model folder, not a safetensors file; import it as a "
            "Hugging Face / timm folder (its config.json names the architecture)"
        )
    return f"{what} is a zip archive, not a safetensors file"


def check_safetensors(path: Path, name: str | None = None) -> None:
    """Refuse anything that is not a plausible safetensors file, before a reader parses it.

    A pickle or torch.save archive, a header length past the file or past
    :data:`MAX_HEADER_BYTES`, a header that is not a JSON object, and a tensor whose offsets lie
    outside the file are refused in one sentence; nothing is unpickled or allocated. ``name``:
    the file as its owner knows it (an upload's file name), which the sentence names.
    """
    what = f"'{name}'" if name else "the weights file"
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(
                f"{what} is too short to be a safetensors file ({len(head)} bytes)"
            )
        if head[:1] == b"\x80":  # a bare pickle (torch.save's legacy format)
            raise CheckpointError(pickle_refusal(what, "and use that"))
        if head[:2] == b"PK":
            raise CheckpointError(_zip_refusal(path, what))
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise CheckpointError(
                f"{what} is not a safetensors file: the header length its first 8 bytes "
                f"declare ({n}) is larger than the file allows"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise CheckpointError(
                f"{what} is not a safetensors file: its header is not valid JSON"
            ) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{what} is not a safetensors file: its header is not a JSON object")
    body = size - 8 - n
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= body
        ):
            raise CheckpointError(f"{what}: tensor {key[:80]!r} lies outside the file")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        check_safetensors(path)
        return load_file(str(path))
    except Exception as exc:  # ours, safetensors' own error type, or OSError
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({exc}); "
            "pickled checkpoints are never loaded"
        ) from exc


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def check_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise a CheckpointError naming missing keys, unexpected keys and shape mismatches."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{key} (checkpoint {tuple(state[key].shape)}, model {tuple(expected[key].shape)})"
        for key in sorted(set(state) & set(expected))
        if state[key].shape != expected[key].shape
    ]
    problems = [
        f"{label}: {_names(items)}"
        for label, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", mismatched),
        )
        if items
    ]
    if problems:
        arch = getattr(model, "atlas_config", {}).get("arch", type(model).__name__)
        raise CheckpointError(f"{source} does not fit {arch}: {'; '.join(problems)}")


def _has_transient_buffers(model: nn.Module) -> bool:
    return any(module._non_persistent_buffers_set for module in model.modules())


def load(
    path: str | os.PathLike[str],
    arch: str | None = None,
    *,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a model from a checkpoint and return ``(model, metadata)`` in eval mode.

    Without ``arch`` the sidecar describes the model and the weights' sha256 is verified.
    With ``arch`` (a preset or any timm name) and ``overrides`` the file is treated as a
    plain safetensors state dict, sidecar or not. Keys and shapes must match exactly. The
    model carries ``atlas_preprocessing`` (its input pipeline) and ``atlas_checkpoint`` (the
    file's sha256, training dataset and seed: what tells seed siblings apart).
    """
    weights = weights_path(path)
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {weights} does not exist")
    digest = file_sha256(weights)
    if arch is None:
        if not sidecar_path(weights).is_file():
            raise CheckpointError(
                f"{weights} has no sidecar {sidecar_path(weights).name}; pass arch= (a timm "
                "model name) to load it as a plain state dict"
            )
        meta = read_sidecar(weights)
        if meta["weights_sha256"] != digest:
            raise CheckpointError(
                f"{weights} has sha256 {digest} but its sidecar records "
                f"{meta['weights_sha256']}; the weights were changed or belong elsewhere"
            )
        arch, config = meta["arch"], {**meta["config"], **overrides}
    else:
        meta, config = {}, dict(overrides)
    state = _read_weights(weights)
    try:
        with torch.device("meta"):
            model = create(arch, **config)
    except ConfigError as exc:
        raise CheckpointError(f"cannot rebuild {arch} for {weights}: {exc}") from exc
    check_state_dict(model, state, str(weights))
    if _has_transient_buffers(model):  # such buffers are not in the file: build for real
        model = create(arch, **config)
        model.load_state_dict(state, strict=True)
    else:
        model.load_state_dict(state, strict=True, assign=True)
    model.to(device).eval()
    if meta.get("preprocessing") is not None:
        pipeline = validate_pipeline(meta["preprocessing"], f"the preprocessing of {weights}")
    else:  # sidecars written before pipelines were recorded, and plain state dicts
        pipeline = data_config(model)
    model.atlas_preprocessing = pipeline  # type: ignore[assignment]
    # What makes two checkpoints seed siblings besides the architecture
    # (analysis.comparison.seed_ceiling).
    model.atlas_checkpoint = {  # type: ignore[assignment]
        "sha256": digest,
        "dataset": meta.get("dataset"),
        "seed": meta.get("seed"),
    }
    if not meta:
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **describe(model),
            "weights_file": weights.name,
            "weights_sha256": digest,
        }
    return model, meta
