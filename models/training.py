"""Training: AdamW with a warm-up + cosine schedule, deterministic on CPU, writes a checkpoint.

``train("mixer_digits", analysis.training_data("digits"), seed=0, out_dir="var/zoo")`` trains
on the train split, evaluates on the test split and saves ``var/zoo/mixer_digits.safetensors``
whose sidecar holds both metrics. Runs are reproducible: the model's construction is seeded by
its config (see :mod:`models._builder`), minibatch order by a generator seeded with ``seed``,
and deterministic algorithms are enforced for the duration of the run.

:func:`build_zoo` trains the demo zoo (the five ``*_digits`` presets and a second seed of the
Mixer) and skips checkpoints that already exist.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from models.checkpoint import read_sidecar, save, weights_path
from models.connections import input_spec
from models.data import LabelledImages, TrainingData, dataset_record, training_splits
from models.errors import CheckpointError, ConfigError, TrainingCancelled
from models.factory import create
from models.families import family_of, recipe
from models.preprocessing import pipeline_from_spec

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


@contextmanager
def _deterministic() -> Iterator[None]:
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


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
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of ``model`` in eval mode."""
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    return {"loss": loss / len(x), "accuracy": correct / len(x), "n": len(x)}


def _optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # As timm does: no weight decay on biases and LayerNorm gains (1-d parameters).
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr)


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

    ``on_step(done, total)`` is called after every optimizer step (and once before the
    first); returning False stops the run with :class:`TrainingCancelled` before anything is
    written, so a cancelled run leaves no checkpoint (the checkpoint itself is written to a
    temporary name and renamed, so no reader ever sees half of one either).
    """
    train_set, test_set = training_splits(dataset)
    assert train_set.y is not None and test_set.y is not None  # training_splits checked them
    num_classes = train_set.num_classes or int(max(train_set.y.max(), test_set.y.max())) + 1
    owner = family_of(arch)
    defaults = recipe("timm" if owner is None else owner.name)
    epochs = defaults.epochs if epochs is None else epochs
    batch_size = defaults.batch_size if batch_size is None else batch_size
    lr = defaults.lr if lr is None else lr
    weight_decay = defaults.weight_decay if weight_decay is None else weight_decay
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ConfigError("epochs and batch size must be at least 1 and the learning rate positive")
    options = _model_options(arch, train_set, num_classes, seed, overrides)

    started = time.perf_counter()
    x_train, y_train = torch.as_tensor(train_set.x), torch.as_tensor(train_set.y)
    x_test, y_test = torch.as_tensor(test_set.x), torch.as_tensor(test_set.y)
    with _deterministic(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = create(arch, **options)
        optimizer = _optimizer(model, lr, weight_decay)
        steps = epochs * math.ceil(len(x_train) / batch_size)
        warmup = max(1, round(defaults.warmup_fraction * steps))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(steps, warmup))
        order = torch.Generator().manual_seed(seed)
        _check(on_step, 0, steps)
        done = 0
        bar = tqdm(range(epochs), desc=name or arch, unit="epoch", disable=not progress)
        for _epoch in bar:
            model.train()
            seen, loss_sum, correct = 0, 0.0, 0
            for batch in torch.randperm(len(x_train), generator=order).split(batch_size):
                logits = model(x_train[batch])
                loss = F.cross_entropy(logits, y_train[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                seen += len(batch)
                loss_sum += loss.item() * len(batch)
                correct += int((logits.argmax(dim=1) == y_train[batch]).sum())
                done += 1
                _check(on_step, done, steps)
            bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.3f}")
        bar.close()
        train_metrics = evaluate(model, x_train, y_train)
        test_metrics: dict[str, Any] = dict(evaluate(model, x_test, y_test))
    _check(on_step, steps, steps)  # a cancel during evaluation still writes nothing
    seconds = time.perf_counter() - started
    test_metrics["dataset"] = dataset_record(test_set)
    return save(
        model,
        Path(out_dir) / f"{name or arch}.safetensors",
        dataset=dataset_record(train_set),
        metrics={"train": train_metrics, "test": test_metrics},
        seed=seed,
        # trained here on whole images in [0, 1]: no resize, no crop, no normalisation
        preprocessing=pipeline_from_spec(list(input_spec(model).shape)),
        training={
            "epochs": epochs,
            "batch_size": batch_size,
            "lr": lr,
            "weight_decay": weight_decay,
            "optimizer": "AdamW",
            "schedule": f"linear warm-up {warmup} steps, cosine to 0 over {steps} steps",
            "seconds": round(seconds, 2),
            "torch_threads": torch.get_num_threads(),
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
    data: TrainingData, out_dir: str | os.PathLike[str] = "var/zoo", *, progress: bool = False
) -> list[ZooEntry]:
    """Train the demo zoo on ``data`` (the digits) into ``out_dir``, skipping checkpoints that
    exist and read cleanly."""
    rows = []
    for name, arch, seed in ZOO:
        path = weights_path(Path(out_dir) / name)
        try:
            rows.append(_entry(name, arch, seed, path, trained=False))
            continue
        except (CheckpointError, KeyError, TypeError):
            pass
        path = train(arch, data, seed=seed, out_dir=out_dir, name=name, progress=progress)
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
