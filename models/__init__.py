"""Architectures, their timm registration, the checkpoint format and training.

The lower of the two libraries: :mod:`models` owns what a network is (families, presets, Ω and
structure, grids), how it is stored (safetensors + sidecar, hub folders) and how it is trained.
It imports torch, timm and the like, never :mod:`analysis` nor :mod:`app`; what it needs of a
dataset is said by the :class:`LabelledImages` protocol (:mod:`models.data`), which
:class:`analysis.ImageDataset` satisfies, and a checkpoint records its data as a plain
``{"name", "sha256"}`` record.

Importing the package registers the project's presets in timm's registry, so both
``timm.create_model("mixer_digits")`` and ``models.create("mixer_digits")`` build them::

    import models
    model = models.create("sw_mlp_digits", seed=1)
    models.connections(model)          # Ω, connections per effective layer
    path = models.save(model, "out/sw_mlp_digits.safetensors", seed=1)
    model, meta = models.load(path)
    config = models.validate_config("sw_mlp_digits", {"density": 0.125})  # or ConfigError
    models.structure("sw_mlp_digits", config)  # Ω, m, p, S, C, γ without allocating weights
    models.fixed_omega_grid("sw_mlp_digits", 24576, widths=[256, 512, 1024])
    models.estimate("sw_mlp_digits", {"density": 0.125}, batch_size=64)  # params, bytes
    digits = analysis.training_data("digits")  # any LabelledImages, or a (train, test) pair
    models.train("sw_mlp_digits", digits, seed=0, density=0.125)  # -> checkpoint path

Families (one module each): ``mixer`` (timm MlpMixer), ``rp_mixer`` (random-permuted Mixer),
``gmlp`` (timm gMLP), ``sw_mlp`` (static sparse-weight MLP and the dense ``mlp``), ``tiny10``
(Kornblith et al. 2019's plain CNN, no residual stream; no S, C nor Ω). Each module
holds all its family knows — options, structure, fixed-Ω grid, training recipe — and registers
it once (:func:`register_family`); the generic functions above look families up there.
"""

from __future__ import annotations

from models import gmlp, mixer, rp_mixer, sw_mlp, tiny10
from models.budget import Budget, check_budget, estimate
from models.checkpoint import (
    check_safetensors,
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
from models.data import LabelledImages, TrainingData, dataset_record
from models.errors import (
    CheckpointError,
    ConfigError,
    InputError,
    ModelError,
    TrainingCancelled,
)
from models.factory import create
from models.families import Family, Recipe, family_of, list_presets, recipe, register_family
from models.grids import GridPoint, fixed_omega_grid
from models.options import (
    STRUCTURE_KEYS,
    model_structure,
    option_schema,
    shape_config,
    structure,
    validate_config,
)
from models.training import train

__all__ = [
    "STRUCTURE_KEYS",
    "Budget",
    "CheckpointError",
    "ConfigError",
    "Family",
    "GridPoint",
    "InputError",
    "InputSpec",
    "LabelledImages",
    "ModelError",
    "Recipe",
    "TrainingCancelled",
    "TrainingData",
    "check_budget",
    "check_safetensors",
    "check_state_dict",
    "connections",
    "create",
    "dataset_record",
    "describe",
    "effective_width",
    "estimate",
    "family_of",
    "file_sha256",
    "fixed_omega_grid",
    "gmlp",
    "input_spec",
    "list_presets",
    "load",
    "mixer",
    "model_structure",
    "option_schema",
    "parameter_count",
    "read_sidecar",
    "recipe",
    "register_family",
    "rp_mixer",
    "save",
    "shape_config",
    "sidecar_path",
    "structure",
    "sw_mlp",
    "tiny10",
    "train",
    "validate_config",
    "validate_metadata",
    "weights_path",
]
