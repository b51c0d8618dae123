"""Training is deterministic, records its metrics, and drives the CLI and the zoo."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import models
from analysis import ImageDataset, load_dataset, training_data
from app.cli import main
from models import training


@pytest.fixture(scope="module")
def small_digits() -> ImageDataset:
    """240 digits images (a user dataset: train() holds out a fixed fifth for testing)."""
    full = load_dataset("digits", split="train")
    return ImageDataset(name="digits-small", x=full.x[:240], y=full.y[:240])


def _sidecar(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


@pytest.mark.parametrize("arch", ["mixer_digits", "sw_mlp_digits"])
def test_training_is_deterministic_for_a_seed(
    arch: str, small_digits: ImageDataset, tmp_path: Path
) -> None:
    runs = [
        training.train(arch, small_digits, epochs=1, seed=seed, out_dir=tmp_path / tag)
        for tag, seed in (("a", 4), ("b", 4), ("c", 5))
    ]
    a, b, c = (_sidecar(run) for run in runs)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["metrics"] == b["metrics"]
    assert c["weights_sha256"] != a["weights_sha256"]
    assert a["metrics"]["test"]["n"] == 48 and a["metrics"]["train"]["n"] == 192
    assert a["dataset"] == {"name": "digits-small:train", "sha256": small_digits.sha256}
    assert a["training"]["epochs"] == 1 and a["seed"] == 4 and a["config"]["seed"] == 4


def test_cli_train_writes_a_checkpoint_with_test_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--arch", "mixer_digits", "--dataset", "digits", "--epochs", "1"]
    argv += ["--device", "cpu", "--precision", "fp32"]
    assert main([*argv, "--seed", "1", "--out", str(tmp_path), "--batch-size", "128"]) == 0
    out, err = capsys.readouterr()
    path = tmp_path / "mixer_digits.safetensors"
    meta = _sidecar(path)
    assert meta["metrics"]["test"]["n"] == 450  # digits' fixed test split
    assert f"{meta['metrics']['test']['accuracy']:.2%}" in out
    where = meta["training"]
    assert where["device"] == "cpu" and where["precision"] == "fp32" and where["deterministic"]
    assert f"(trained on cpu, {where['device_name']}, fp32)" in out
    assert "epoch" in err  # the progress bar
    model, _ = models.load(path)
    assert models.connections(model) == 24576


def test_cli_reports_errors_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--arch", "mixer_galactic", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: unknown architecture 'mixer_galactic'")


def test_training_on_a_file_adapts_shape_and_classes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(40, 16, 16, 3), dtype=np.uint8)
    np.savez(tmp_path / "tiny.npz", x=x, y=np.arange(40) % 4)
    data = training_data(tmp_path / "tiny.npz")
    path = training.train("mixer_digits", data, epochs=1, out_dir=tmp_path)
    meta = _sidecar(path)
    assert meta["input_shape"] == [3, 16, 16] and meta["num_classes"] == 4
    assert meta["config"]["img_size"] == 16 and meta["metrics"]["test"]["n"] == 8


def test_zoo_skips_existing_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(training, "ZOO", (("tiny_mixer", "mixer_digits", 0),))
    mixer = models.families.family("mixer")
    quick = dataclasses.replace(mixer, recipe=models.Recipe(epochs=1, lr=3e-3))
    monkeypatch.setitem(models.families._FAMILIES, "mixer", quick)
    digits = training_data("digits")
    first = training.build_zoo(digits, tmp_path)
    assert [row.trained for row in first] == [True]
    assert main(["zoo", "--out", str(tmp_path), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "| tiny_mixer | 22,122 | 24,576 |" in table and "(cached)" in table
    second = training.build_zoo(digits, tmp_path)
    assert second[0].accuracy == first[0].accuracy and not second[0].trained


def test_on_step_false_stops_between_steps_and_writes_nothing(
    small_digits: ImageDataset, tmp_path: Path
) -> None:
    calls: list[tuple[int, int]] = []

    def on_step(done: int, total: int) -> bool:
        calls.append((done, total))
        return done < 2

    with pytest.raises(models.TrainingCancelled, match="after 2 of 6 steps"):
        training.train(
            "mlp_digits", small_digits, epochs=2, batch_size=64, out_dir=tmp_path, on_step=on_step
        )
    # 192 training images in batches of 64: 3 steps an epoch, 6 in all; it stopped at step 2
    assert calls == [(0, 6), (1, 6), (2, 6)]
    assert list(tmp_path.iterdir()) == []


def test_training_takes_data_not_a_name(small_digits: ImageDataset, tmp_path: Path) -> None:
    """models never loads a dataset itself (it does not import analysis): a name, data without
    labels or a one-image dataset is refused with a sentence before any work."""
    unlabelled = ImageDataset(name="bare", x=small_digits.x[:10])
    one = ImageDataset(name="one", x=small_digits.x[:1], y=small_digits.y[:1])
    for data, message in [
        ("digits", "not the name 'digits': load it first"),
        (unlabelled, "dataset bare has no labels"),
        (one, "dataset one needs at least two images"),
    ]:
        with pytest.raises(models.ConfigError, match=message):
            training.train("mlp_digits", data, epochs=1, out_dir=tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_train_test_pair_is_used_as_given(small_digits: ImageDataset, tmp_path: Path) -> None:
    train_part = ImageDataset(name="mine:train", x=small_digits.x[:200], y=small_digits.y[:200])
    test_part = ImageDataset(name="mine:test", x=small_digits.x[200:], y=small_digits.y[200:])
    path = training.train("mlp_digits", (train_part, test_part), epochs=1, out_dir=tmp_path)
    meta = _sidecar(path)
    assert meta["metrics"]["train"]["n"] == 200 and meta["metrics"]["test"]["n"] == 40
    assert meta["dataset"] == models.dataset_record(train_part)
    assert meta["metrics"]["test"]["dataset"] == {"name": "mine:test", "sha256": test_part.sha256}
