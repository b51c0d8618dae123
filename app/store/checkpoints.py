"""Checkpoints in the artifact store: validation of uploads, registration, loading.

A checkpoint is stored as ``<sha>.safetensors`` with its sidecar at ``<sha>.json`` (same
blob directory), which is exactly the pair :func:`models.load` reads. ``sha`` is the sha256
of the weights file. An upload is checked by the library before it is stored: a safetensors
header that is sane (never a pickle: models.check_safetensors), a sidecar that fits the one
sidecar schema (models.validate_metadata), and weights that load strictly into the model the
sidecar describes. A model row holds the library's description (models.describe).
:mod:`models` and timm are imported by the functions that use them, so the server starts
without loading them.
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from pathlib import Path, PurePath
from typing import Any

from analysis.layers import default_layers
from app.errors import ProblemError
from app.store.artifacts import ArtifactStore
from app.store.values import clean_name

__all__ = [
    "LOADER_OPTIONS",
    "check_safetensors",
    "describe_model",
    "hub_checkpoint",
    "load_checkpoint",
    "pretrained_checkpoint",
    "refuse_loader_options",
    "shown",
    "sidecar_differences",
    "store_checkpoint",
    "timm_checkpoint",
]

# timm.create_model keywords that load weights from somewhere other than the uploaded file
# (a URL, the Hugging Face hub, a local path) or choose where downloads are written, and the
# device, which the service chooses.
LOADER_OPTIONS = frozenset(
    {
        "pretrained",
        "pretrained_cfg",
        "pretrained_cfg_overlay",
        "pretrained_strict",
        "checkpoint_path",
        "cache_dir",
        "device",
    }
)


def refuse_loader_options(config: Any, field: str) -> None:
    """422 if a model config names a loader option (see LOADER_OPTIONS)."""
    if not isinstance(config, dict):
        return
    found = sorted(k for k in config if isinstance(k, str) and k in LOADER_OPTIONS)
    if found:
        raise ProblemError(
            422,
            "invalid_checkpoint",
            f"the model options {found} are not accepted: the service builds the "
            "architecture and loads only the uploaded weights",
            field=field,
        )


MAX_SIDECAR_BYTES = 1024 * 1024  # models.save writes a few kilobytes


def _bad(detail: str, field: str = "weights") -> ProblemError:
    return ProblemError(422, "invalid_checkpoint", detail, field=field)


def _file_name(name: str | None) -> str | None:
    """A file name the user sent, as sentences show it: its last part, storable, short."""
    return clean_name(PurePath(name or "").name, 100) or None


def shown(name: str | None, fallback: str) -> str:
    """How a sentence names a file the user sent: its file name quoted, else ``fallback``."""
    clean = _file_name(name)
    return f"'{clean}'" if clean else fallback


def check_safetensors(path: Path, name: str | None = None) -> None:
    """The library's header check (models.check_safetensors) as a 422 on the weights, naming
    the file as the user sent it (``name``); a zipped model folder is pointed to ``hub``."""
    import models

    what = shown(name, "the weights")
    if zipfile.is_zipfile(path):
        with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(path) as archive:
            if any(PurePath(n).name == "config.json" for n in archive.namelist()[:10_000]):
                raise _bad(
                    f"{what} is a zipped model folder, not safetensors weights: send it as "
                    "hub, alone (its config.json names the architecture)"
                )
    try:
        models.check_safetensors(path, _file_name(name))
    except models.CheckpointError as exc:
        raise _bad(str(exc)) from None


def describe_model(model: Any) -> dict[str, Any]:
    """The columns of a model row: the library's description (models.describe) as it is, with
    S and C in the ``tokens`` and ``channels`` columns, and the default layers."""
    import models

    info = models.describe(model)
    structure = info["structure"]
    return {
        "family": structure["family"],
        "omega": structure["omega"],
        "effective_width": structure["effective_width"],
        "density": structure["density"],
        "tokens": structure["S"],
        "channels": structure["C"],
        "gamma": structure["gamma"],
        "arch": info["arch"],
        "config": info["config"],
        "input_shape": info["input_shape"],
        "num_classes": info["num_classes"],
        "parameters": info["parameters"],
        "connections": info["connections"],
        "default_layers": list(default_layers(model)),
        "preprocessing": info["preprocessing"],
    }


# Sidecar fields that describe the file, not the model: a re-save of the same weights
# changes them, and they are not compared when the weights are stored already.
FILE_FIELDS = frozenset(
    {"created", "weights_file", "package_version", "torch_version", "timm_version"}
)


def sidecar_differences(stored: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two sidecars disagree, file fields (FILE_FIELDS) left out."""
    if isinstance(stored, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(stored) | set(new), key=str):
            if not prefix and key in FILE_FIELDS:
                continue
            where = f"{prefix}{key}"
            if key not in stored or key not in new:
                out.append(where)
            else:
                out += sidecar_differences(stored[key], new[key], f"{where}.")
        return out
    return [] if stored == new else [prefix.rstrip(".") or "(the whole sidecar)"]


def store_checkpoint(
    store: ArtifactStore,
    weights: Path,
    sidecar: Path,
    *,
    keep_stored: bool = False,
    weights_name: str | None = None,
    sidecar_name: str | None = None,
) -> tuple[str, int, Any]:
    """Validate the pair and put it into the store. Returns (sha256, size, loaded model).

    Weights in the store's scratch space (an upload) are moved into place, not copied; weights
    from elsewhere (a file of the operator's) are copied once.

    A stored model never changes: the weights are content-addressed and the sidecar is
    written once, beside them. Weights already stored with a sidecar that differs (beyond
    FILE_FIELDS) are refused with 409 naming the fields, unless ``keep_stored`` (the
    service's own trainings), which keeps the stored sidecar.

    ``weights_name`` and ``sidecar_name``: the files as the user sent them, which refusals
    name (never the server's paths).
    """
    import models

    check_safetensors(weights, weights_name)
    side = "the sidecar" + (f" {shown(sidecar_name, '')}" if _file_name(sidecar_name) else "")
    if sidecar.stat().st_size > MAX_SIDECAR_BYTES:
        raise _bad(f"{side} is larger than {MAX_SIDECAR_BYTES} bytes", field="sidecar")
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _bad(f"{side} is not valid JSON", field="sidecar") from None
    if not isinstance(meta, dict):
        raise _bad(f"{side} must be a JSON object", field="sidecar")
    refuse_loader_options(meta.get("config"), "sidecar")
    try:
        models.validate_metadata(meta, source=side)
    except models.ModelError as exc:
        raise _bad(str(exc), field="sidecar") from None
    with store.scratch() as tmp:
        # models.load reads the pair <stem>.safetensors + <stem>.json: the weights are linked
        # beside the checked sidecar, not copied, and the link is renamed into the store, so
        # an upload takes its size in the store once.
        w = Path(tmp) / "model.safetensors"
        store.link_or_copy(weights, w)
        with store.writing():
            w.with_suffix(".json").write_text(json.dumps(meta), encoding="utf-8")
        model, _ = _load_upload(
            lambda: models.load(w), w, options_field="sidecar", name=weights_name
        )
        sha, size = store.put_file(w, ".safetensors")
    # The stored sidecar also records the structure the library measures on the model.
    meta["structure"] = models.model_structure(model)
    stored = store.put_once(json.dumps(meta, sort_keys=True).encode(), sha, ".json")
    if stored is not None and not keep_stored:
        try:
            differ = sidecar_differences(json.loads(stored), meta)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            differ = ["(the stored sidecar cannot be read)"]
        if differ:
            raise ProblemError(
                409,
                "model_exists",
                "these weights are stored already with a different sidecar (it differs in "
                f"{', '.join(differ[:10])}); a stored model never changes: delete it first "
                "to register the weights with another sidecar",
                field="sidecar",
            )
    return sha, size, model


def timm_checkpoint(
    store: ArtifactStore,
    name: str,
    weights: Path,
    config: dict[str, Any],
    *,
    weights_name: str | None = None,
) -> tuple[str, int, Any]:
    """Load weights as a plain state dict of timm model ``name``; store them with a sidecar.
    ``weights_name``: the weights' file as the user sent it."""
    import timm

    import models

    check_safetensors(weights, weights_name)
    refuse_loader_options(config, "config")
    if not timm.is_model(name):  # presets are registered with timm by ``import models``
        raise _bad(f"{name[:200]!r} is not a preset or timm model name", field="timm_name")
    _model, meta = _load_upload(
        lambda: models.load(weights, arch=name, **config),
        weights,
        options_field="config",
        name=weights_name,
    )
    sidecar = weights.with_suffix(".json")
    with store.writing():
        sidecar.write_text(json.dumps(meta), encoding="utf-8")
    return store_checkpoint(store, weights, sidecar, weights_name=weights_name)


def hub_checkpoint(
    store: ArtifactStore, archive: Path, max_bytes: int, name: str | None = None
) -> tuple[str, int, Any]:
    """Import a zipped Hugging Face / timm model folder; store it as a checkpoint pair.

    The folder's ``config.json`` builds the architecture (loader options refused), its
    ``model.safetensors`` must fit strictly, and its data config becomes the pipeline.
    ``name``: the archive's file name as the user sent it, which refusals name.
    """
    from models import ModelError
    from models.hub import import_hub

    label = _file_name(name) or "the uploaded folder"
    with store.scratch() as tmp:
        unpacked = Path(tmp) / "folder"
        unpacked.mkdir()
        try:
            path = import_hub(
                archive, Path(tmp) / "model.safetensors", unpacked, max_bytes=max_bytes, name=label
            )
        except ModelError as exc:
            raise _bad(str(exc).replace(str(archive), f"'{label}'"), field="hub") from None
        except OSError:
            raise
        except Exception as exc:  # timm constructors raise anything on hostile model_args
            raise _bad(
                f"the architecture of '{label}' cannot be built ({type(exc).__name__}: "
                f"{str(exc)[:300]})",
                field="hub",
            ) from None
        return store_checkpoint(store, path, path.with_suffix(".json"))


def pretrained_checkpoint(
    store: ArtifactStore, name: str, config: dict[str, Any], directory: Path | None
) -> tuple[str, int, Any]:
    """timm model ``name`` with published weights from the operator's directory (offline)."""
    import timm

    import models
    from models import ModelError
    from models.pretrained import create_pretrained

    options = {k: v for k, v in config.items() if k != "pretrained"}
    refuse_loader_options(options, "config")
    if not timm.is_model(name):
        raise _bad(f"{name[:200]!r} is not a preset or timm model name", field="timm_name")
    if directory is None:
        raise _bad(
            "pretrained weights are read only from CKA_PRETRAINED_DIR, which this service "
            "does not set; upload weights instead",
            field="config",
        )
    try:
        model = create_pretrained(name, directory, **options)
    except ModelError as exc:
        raise _bad(str(exc), field="config") from None
    with store.scratch() as tmp:
        path = models.save(model, Path(tmp) / "model.safetensors")
        return store_checkpoint(store, path, path.with_suffix(".json"))


def _load_upload(
    load: Any, path: Path, *, options_field: str, name: str | None = None
) -> tuple[Any, dict[str, Any]]:
    """Run ``models.load`` on an upload: every way it fails is the uploader's, so a 422.

    A config that cannot build its architecture is blamed on ``options_field`` (the sidecar
    or the config form field), anything else (unreadable tensors, missing or unexpected
    keys, wrong shapes, a sha256 the sidecar does not record) on the weights. timm's
    constructors raise whatever they raise on hostile options, hence the broad except.
    Messages name the file as the user sent it (``name``; else "the uploaded weights"),
    never the server's scratch path.
    """
    from models import ConfigError, ModelError

    try:
        result: tuple[Any, dict[str, Any]] = load()
    except ModelError as exc:
        blame = options_field if isinstance(exc.__cause__, ConfigError) else "weights"
        what = shown(name, "the uploaded weights")
        raise _bad(str(exc).replace(str(path), what), field=blame) from None
    except OSError:  # the server's own I/O (a full or unreadable store) is not the upload's fault
        raise
    except Exception as exc:
        raise _bad(
            f"the architecture cannot be built with these options ({type(exc).__name__}: "
            f"{str(exc)[:300]})",
            field=options_field,
        ) from None
    return result


def load_checkpoint(store: ArtifactStore, sha: str) -> tuple[Any, dict[str, Any]]:
    import models

    model, meta = models.load(store.path(sha, ".safetensors"))
    return model, dict(meta)
