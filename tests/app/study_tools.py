"""A stand-in for ``models.training.train`` that skips the optimisation, for study tests.

It builds the model exactly as training would (same preset, options and seed, so the same
initial weights), saves it with a test accuracy from a formula the tests know and the training
record's device part as training writes it (:func:`models.devices.provenance`), and counts its
calls and the devices it was asked for, so a test can tell how many trainings a study really
ran, and where. The real training is tested
in tests/models; here what matters is which trainings run, and what is done with their models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import models
from models.devices import placement, provenance
from models.errors import TrainingCancelled

# A small study: the Mixer reference and two SW-MLP densities, two seeds each (6 trainings),
# one epoch on its quick recipe.
TINY = {
    "name": "tiny",
    "dataset": "digits",
    "seeds": 2,
    "quick": {"epochs": 1},
    "reference": {"name": "mixer", "arch": "mixer_digits"},
    "arms": [{"name": "sw", "arch": "sw_mlp_digits", "grid": {"density": [0.125, "matched"]}}],
    "cka": {"batch_size": 150},
}


def fake_accuracy(arch: str, options: dict[str, Any], seed: int) -> float:
    """The test accuracy the fake reports: distinct per arch, density and seed."""
    density = float(options.get("density") or 1.0)
    return round(0.5 + 0.1 * seed + 0.01 * len(arch) + 0.05 * density, 6)


class FakeTrainer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any]]] = []
        self.devices: list[str | None] = []
        # Called with the number of calls so far after each one (a test's hook).
        self.after: Callable[[int], None] | None = None

    def __call__(
        self,
        arch: str,
        dataset: Any = "digits",
        *,
        out_dir: Any,
        seed: int = 0,
        name: str | None = None,
        progress: bool = False,
        epochs: int | None = None,
        batch_size: int | None = None,
        lr: float | None = None,
        weight_decay: float | None = None,
        device: str | None = None,
        precision: str = "fp32",
        on_step: Callable[[int, int], bool] | None = None,
        **options: Any,
    ) -> Path:
        if on_step is not None and not on_step(0, 1):  # cancelled before its one "step"
            raise TrainingCancelled("stopped before the first step")
        place = placement(device, precision)
        self.calls.append((arch, seed, dict(options)))
        self.devices.append(device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = models.create(arch, **{"seed": seed, **options})
        accuracy = fake_accuracy(arch, options, seed)
        path = models.save(
            model,
            Path(out_dir) / f"{name or arch}.safetensors",
            seed=seed,
            metrics={"test": {"accuracy": accuracy, "n": 450}},
            training={
                "epochs": epochs,
                "batch_size": batch_size,
                "lr": lr,
                **provenance(place, seed=seed, deterministic=True),
            },
        )
        if self.after is not None:
            self.after(len(self.calls))
        return path
