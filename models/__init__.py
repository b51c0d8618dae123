"""Architectures, their timm registration, the checkpoint format and training.

Importing the package registers the project's presets in timm's registry, so both
``timm.create_model("mixer_digits")`` and ``models.create("mixer_digits")`` build them::

    import models
    model = models.create("sw_mlp_digits", seed=1)
    models.connections(model)          # Ω, connections per effective layer
    path = models.save(model, "out/sw_mlp_digits.safetensors", seed=1)
    model, meta = models.load(path)

Families (one module each): ``mixer`` (timm MlpMixer), ``rp_mixer`` (random-permuted Mixer),
``gmlp`` (timm gMLP), ``sw_mlp`` (static sparse-weight MLP and the dense ``mlp``).
"""

from __future__ import annotations

from models import gmlp, mixer, rp_mixer, sw_mlp
from models._builder import list_presets
from models.checkpoint import (
    check_state_dict,
    describe,
    file_sha256,
    load,
    read_sidecar,
    save,
    sidecar_path,
    validate_metadata,
    weights_path,
)
from models.connections import (
    InputSpec,
    connections,
    effective_width,
    input_spec,
    parameter_count,
)
from models.errors import CheckpointError, ConfigError, ModelError, TrainingCancelled
from models.factory import create

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InputSpec",
    "ModelError",
    "TrainingCancelled",
    "check_state_dict",
    "connections",
    "create",
    "describe",
    "effective_width",
    "file_sha256",
    "gmlp",
    "input_spec",
    "list_presets",
    "load",
    "mixer",
    "parameter_count",
    "read_sidecar",
    "rp_mixer",
    "save",
    "sidecar_path",
    "sw_mlp",
    "validate_metadata",
    "weights_path",
]
