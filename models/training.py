"""Training: AdamW with a warm-up + cosine schedule, on a chosen device, writes a checkpoint.

``train("mixer_digits", analysis.training_data("digits"), seed=0, out_dir="var/zoo")`` trains
on the train split, evaluates on the test split and saves ``var/zoo/mixer_digits.safetensors``
whose sidecar holds both metrics. ``device`` and ``precision`` (:mod:`models.devices`) say where
and how: the host in fp32 by default. Runs are reproducible: the model is built on the host,
seeded by its config (see :mod:`models._builder`) and ``seed``, the minibatch order comes from a
CPU generator seeded with ``seed``, and deterministic algorithms are enforced for the duration
of the run; the sidecar's ``training`` record says where it ran and with what
(:func:`models.devices.provenance`), and what is bit-reproducible where is said there.

:func:`build_zoo` trains the demo zoo (the five ``*_digits`` presets and a second seed of the
Mixer) and skips checkpoints that already exist.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from models import step_capture
from models.checkpoint import read_sidecar, save, weights_path
from models.connections import input_spec
from models.data import LabelledImages, TrainingData, dataset_record, training_splits
from models.devices import Placement, deterministic_algorithms, placement, provenance
from models.errors import CheckpointError, ConfigError, TrainingCancelled
from models.factory import create
from models.families import family_of, recipe
from models.preprocessing import pipeline_from_spec
from models.step_capture import TrainingStep

__all__ = ["ZOO", "ZooEntry", "build_zoo", "format_zoo_table", "train"]

# (checkpoint name, preset, seed): the five digits presets and a second seed of the Mixer, so
# the atlas can show how much two runs of one architecture differ.
ZOO: tuple[tuple[str, str, int], ...] = (
    ("mixer_digits", "mixer_digits", 0),
    ("sw_mlp_digits", "sw_mlp_digits", 0),
    ("rp_mixer_digits", "rp_mixer_digits", 0),
    ("gmlp_digits", "gmlp_digits", 0),
    ("mlp_digits", "mlp_digits", 0),
    ("mixer_digits_seed1", "mixer_digits", 1),
)


@dataclass(frozen=True)
class ZooEntry:
    """One row of the zoo table; ``trained`` is False when the checkpoint already existed."""

    name: str
    arch: str
    seed: int
    path: Path
    parameters: int
    connections: int | None
    accuracy: float
    seconds: float
    trained: bool


# How PyTorch words the refusal of an operation that has no deterministic implementation.
_NO_DETERMINISTIC = "does not have a deterministic implementation"


def _model_options(
    arch: str, data: LabelledImages, num_classes: int, seed: int, overrides: dict[str, Any]
) -> dict[str, Any]:
    options = dict(overrides)
    if family_of(arch) is not None:
        options.setdefault("seed", seed)
    with torch.device("meta"):
        spec = input_spec(create(arch, **options))
    channels, height, width = data.shape
    if (channels, height, width) != spec.shape:
        if height != width:
            raise ConfigError(f"{arch} takes square images; the dataset's are {height}×{width}")
        options.setdefault("in_chans", channels)
        options.setdefault("img_size", height)
    if num_classes != spec.num_classes:
        options.setdefault("num_classes", num_classes)
    return options


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 512,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of ``model`` in eval mode, in float32, batches moved to
    ``device`` (the host by default; where the model is)."""
    model.eval()
    dev = device or torch.device("cpu")
    loss = torch.zeros((), dtype=torch.float64, device=dev)
    correct = torch.zeros((), dtype=torch.int64, device=dev)
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size].to(dev, non_blocking=True))
        target = y[start : start + batch_size].to(dev, non_blocking=True)
        loss += F.cross_entropy(logits.float(), target, reduction="sum").double()
        correct += (logits.argmax(dim=1) == target).sum()
    return {"loss": float(loss) / len(x), "accuracy": int(correct) / len(x), "n": len(x)}


def _schedule(total: int, warmup: int) -> Any:
    """Linear warm-up over ``warmup`` steps, then cosine decay to zero at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return factor


def _check(on_step: Callable[[int, int], bool] | None, done: int, total: int) -> None:
    if on_step is not None and not on_step(done, total):
        raise TrainingCancelled(f"training stopped after {done} of {total} steps")


@dataclass(frozen=True)
class _Recipe:
    """The settled hyper-parameters of one training."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float


def _fit(
    arch: str,
    options: dict[str, Any],
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    recipe_: _Recipe,
    *,
    seed: int,
    place: Placement,
    deterministic: bool,
    label: str,
    progress: bool,
    on_step: Callable[[int, int], bool] | None,
) -> tuple[nn.Module, dict[str, Any], int, int, str]:
    """One optimisation on ``place``: (model, {"train", "test"} metrics, warm-up, steps, how
    the steps ran: :attr:`TrainingStep.record`)."""
    x_train, y_train, x_test, y_test = data
    dev = place.device
    rng_devices = [dev.index] if place.is_cuda else []
    exact = deterministic_algorithms(place) if deterministic else nullcontext()
    with exact, torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        model = create(arch, **options).to(dev)  # built on the host: the same start anywhere
        optimizer = step_capture.optimizer(model, recipe_.lr, recipe_.weight_decay, place)
        steps = recipe_.epochs * math.ceil(len(x_train) / recipe_.batch_size)
        warmup = max(1, round(recipe_.warmup_fraction * steps))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(steps, warmup))
        order = torch.Generator().manual_seed(seed)  # on the host: the order is device-free
        step = TrainingStep(model, optimizer, place, recipe_.batch_size)
        _check(on_step, 0, steps)
        done = 0
        bar = tqdm(range(recipe_.epochs), desc=label, unit="epoch", disable=not progress)
        for _epoch in bar:
            model.train()
            # Summed on the device, read once an epoch: a read per step would wait for the GPU.
            loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
            correct = torch.zeros((), dtype=torch.int64, device=dev)
            for batch in torch.randperm(len(x_train), generator=order).split(recipe_.batch_size):
                x = x_train[batch].to(dev, non_blocking=True)
                y = y_train[batch].to(dev, non_blocking=True)
                loss, logits = step(x, y)  # replayed from a CUDA graph where it can be
                scheduler.step()
                loss_sum += loss.detach().double() * len(batch)
                correct += (logits.argmax(dim=1) == y).sum()
                done += 1
                _check(on_step, done, steps)
            seen = len(x_train)
            bar.set_postfix(loss=f"{float(loss_sum) / seen:.4f}", acc=f"{int(correct) / seen:.3f}")
        bar.close()
        metrics = {
            "train": evaluate(model, x_train, y_train, device=dev),
            "test": dict(evaluate(model, x_test, y_test, device=dev)),
        }
    return model, metrics, warmup, steps, step.record


def train(
    arch: str,
    dataset: TrainingData,
    *,
    epochs: int | None = None,
    seed: int = 0,
    out_dir: str | os.PathLike[str] = "var/checkpoints",
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    progress: bool = False,
    name: str | None = None,
    on_step: Callable[[int, int], bool] | None = None,
    **overrides: Any,
) -> Path:
    """Train ``arch`` on ``dataset``; return the checkpoint.

    ``dataset`` is a ``(train, test)`` pair of labelled image datasets, or one of which a fixed
    fifth is held out for testing (:mod:`models.data`; ``analysis.training_data("digits")``
    gives digits' fixed split).

    Unset hyper-parameters come from the family's recipe (:func:`models.families.recipe`);
    ``overrides`` go to
    the architecture (e.g. ``density=0.1``). Input shape and class count follow the dataset.

    ``device`` (None: the host; ``"cuda"``, ``"cuda:1"``) and ``precision`` (``"fp32"``, or
    ``"bf16"`` autocast) are checked before any work (:mod:`models.devices`): the model and each
    minibatch move there, the test metrics are computed there in float32, and the checkpoint
    is written from host copies. On a GPU each step is captured once as a CUDA graph and
    replayed (:mod:`models.step_capture`; the sidecar's ``training.step_capture`` says whether,
    or why not). Deterministic algorithms are on; an architecture with an
    operation that has none on that device is trained again from the start without them, and
    its sidecar says so (``training.deterministic`` false, ``nondeterministic``: which one).

    ``on_step(done, total)`` is called after every optimizer step (and once before the
    first); returning False stops the run with :class:`TrainingCancelled` before anything is
    written, so a cancelled run leaves no checkpoint (the checkpoint itself is written to a
    temporary name and renamed, so no reader ever sees half of one either).
    """
    place = placement(device, precision)
    train_set, test_set = training_splits(dataset)
    assert train_set.y is not None and test_set.y is not None  # training_splits checked them
    num_classes = train_set.num_classes or int(max(train_set.y.max(), test_set.y.max())) + 1
    owner = family_of(arch)
    defaults = recipe("timm" if owner is None else owner.name)
    settled = _Recipe(
        epochs=defaults.epochs if epochs is None else epochs,
        batch_size=defaults.batch_size if batch_size is None else batch_size,
        lr=defaults.lr if lr is None else lr,
        weight_decay=defaults.weight_decay if weight_decay is None else weight_decay,
        warmup_fraction=defaults.warmup_fraction,
    )
    if settled.epochs < 1 or settled.batch_size < 1 or settled.lr <= 0:
        raise ConfigError("epochs and batch size must be at least 1 and the learning rate positive")
    options = _model_options(arch, train_set, num_classes, seed, overrides)

    started = time.perf_counter()
    data = (
        torch.as_tensor(train_set.x),
        torch.as_tensor(train_set.y),
        torch.as_tensor(test_set.x),
        torch.as_tensor(test_set.y),
    )
    fit = partial(
        _fit,
        arch,
        options,
        data,
        settled,
        seed=seed,
        place=place,
        label=name or arch,
        progress=progress,
        on_step=on_step,
    )
    fallback: dict[str, Any] = {}
    try:
        model, metrics, warmup, steps, capture = fit(deterministic=True)
    except RuntimeError as exc:
        if _NO_DETERMINISTIC not in str(exc):
            raise
        fallback = {"nondeterministic": str(exc).split(". ")[0][:300]}
        model, metrics, warmup, steps, capture = fit(deterministic=False)
    _check(on_step, steps, steps)  # a cancel during evaluation still writes nothing
    seconds = time.perf_counter() - started
    metrics["test"]["dataset"] = dataset_record(test_set)
    return save(
        model,
        Path(out_dir) / f"{name or arch}.safetensors",
        dataset=dataset_record(train_set),
        metrics=metrics,
        seed=seed,
        # trained here on whole images in [0, 1]: no resize, no crop, no normalisation
        preprocessing=pipeline_from_spec(list(input_spec(model).shape)),
        training={
            "epochs": settled.epochs,
            "batch_size": settled.batch_size,
            "lr": settled.lr,
            "weight_decay": settled.weight_decay,
            "optimizer": "AdamW",
            "schedule": f"linear warm-up {warmup} steps, cosine to 0 over {steps} steps",
            "seconds": round(seconds, 2),
            "torch_threads": torch.get_num_threads(),
            **provenance(place, seed=seed, deterministic=not fallback),
            "step_capture": capture,
            **fallback,
        },
    )


def _entry(name: str, arch: str, seed: int, path: Path, trained: bool) -> ZooEntry:
    meta = read_sidecar(path)
    return ZooEntry(
        name=name,
        arch=arch,
        seed=seed,
        path=path,
        parameters=int(meta.get("free_parameters") or meta.get("parameters") or 0),
        connections=meta.get("connections"),
        accuracy=float(meta["metrics"]["test"]["accuracy"]),
        seconds=float((meta.get("training") or {}).get("seconds", 0.0)),
        trained=trained,
    )


def build_zoo(
    data: TrainingData,
    out_dir: str | os.PathLike[str] = "var/zoo",
    *,
    progress: bool = False,
    device: str | torch.device | None = None,
) -> list[ZooEntry]:
    """Train the demo zoo on ``data`` (the digits) into ``out_dir`` on ``device`` (the host by
    default), skipping checkpoints that exist and read cleanly."""
    placement(device)  # a device that is not there is refused before any work
    rows = []
    for name, arch, seed in ZOO:
        path = weights_path(Path(out_dir) / name)
        try:
            rows.append(_entry(name, arch, seed, path, trained=False))
            continue
        except (CheckpointError, KeyError, TypeError):
            pass
        path = train(
            arch, data, seed=seed, out_dir=out_dir, name=name, progress=progress, device=device
        )
        rows.append(_entry(name, arch, seed, path, trained=True))
    return rows


def format_zoo_table(rows: list[ZooEntry]) -> str:
    """A Markdown table: model, parameters (free), Ω, test accuracy, training seconds."""
    lines = [
        "| model | params | Ω | test accuracy | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        omega = "–" if row.connections is None else f"{row.connections:,}"
        seconds = f"{row.seconds:.1f}" + ("" if row.trained else " (cached)")
        lines.append(
            f"| {row.name} | {row.parameters:,} | {omega} | {row.accuracy:.2%} | {seconds} |"
        )
    return "\n".join(lines)
