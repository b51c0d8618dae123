"""Checkpoint round trips, sidecar contents, and errors that name what is wrong."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

import models

DIGITS = ["mixer_digits", "sw_mlp_digits", "rp_mixer_digits", "gmlp_digits", "mlp_digits"]


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    model = models.create("mixer_digits", seed=2)
    return models.save(
        model,
        tmp_path / "mixer_digits.safetensors",
        dataset={"name": "digits:train", "sha256": "ab" * 32},
        metrics={"train": {"accuracy": 1.0}, "test": {"accuracy": 0.9}},
        seed=2,
        note="kept",
    )


@pytest.mark.parametrize("name", DIGITS)
def test_round_trip_gives_bit_identical_outputs(name: str, tmp_path: Path) -> None:
    model = models.create(name, seed=1).eval()
    x = torch.rand(8, 1, 8, 8)
    path = models.save(model, tmp_path / f"{name}.safetensors")
    loaded, meta = models.load(path)
    assert not loaded.training
    assert torch.equal(loaded(x), model(x))
    assert meta["arch"] == name and meta["config"] == model.atlas_config["config"]
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_permutations_survive_save_and_load(tmp_path: Path) -> None:
    model = models.create("rp_mixer_digits", seed=9)
    loaded, _ = models.load(models.save(model, tmp_path / "rp.safetensors"))
    for a, b in zip(model.blocks, loaded.blocks, strict=True):
        assert torch.equal(a.perm_tokens, b.perm_tokens)
        assert torch.equal(a.perm_channels, b.perm_channels)
    assert "blocks.3.perm_channels" in load_file(tmp_path / "rp.safetensors")


def test_sidecar_records_provenance(saved: Path) -> None:
    meta = json.loads(saved.with_suffix(".json").read_text())
    assert meta["format"] == "cka-atlas-checkpoint" and meta["format_version"] == 1
    assert meta["arch"] == meta["preset"] == "mixer_digits"
    assert meta["config"]["seed"] == 2 and meta["seed"] == 2
    assert meta["input_shape"] == [1, 8, 8] and meta["num_classes"] == 10
    assert meta["normalisation"] == {"mean": [0.0], "std": [1.0]}
    assert meta["dataset"] == {"name": "digits:train", "sha256": "ab" * 32}
    assert meta["metrics"]["test"]["accuracy"] == 0.9
    assert meta["connections"] == 24576 and meta["effective_width"] == 512
    assert meta["parameters"] == sum(p.numel() for p in models.create("mixer_digits").parameters())
    assert meta["weights_sha256"] == models.file_sha256(saved)
    assert meta["created"].endswith("Z") and meta["package_version"]
    assert meta["extra"] == {"note": "kept"}
    assert models.read_sidecar(saved) == meta


def test_changed_weights_fail_the_sha256_check(saved: Path) -> None:
    state = load_file(saved)
    state["head.bias"] = state["head.bias"] + 1
    save_file(state, saved)
    with pytest.raises(models.CheckpointError, match="sha256"):
        models.load(saved)


def _rewrite(path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    state = load_file(path)
    edit(state)
    target = path.with_name("edited.safetensors")
    save_file(state, target)
    return target


def test_missing_unexpected_and_mismatched_keys_are_named(saved: Path) -> None:
    def edit(state: dict[str, torch.Tensor]) -> None:
        del state["blocks.1.norm2.weight"]
        state["blocks.9.extra"] = torch.zeros(2)
        state["head.weight"] = torch.zeros(5, 32)

    edited = _rewrite(saved, edit)
    with pytest.raises(models.CheckpointError) as info:
        models.load(edited, arch="mixer_digits")
    message = str(info.value)
    assert "missing keys: blocks.1.norm2.weight" in message
    assert "unexpected keys: blocks.9.extra" in message
    assert "head.weight (checkpoint (5, 32), model (10, 32))" in message


def test_pickle_files_are_refused(tmp_path: Path) -> None:
    model = models.create("mixer_digits")
    fake = tmp_path / "fake.safetensors"
    torch.save(model.state_dict(), fake)
    with pytest.raises(models.CheckpointError, match="not a readable safetensors file"):
        models.load(fake, arch="mixer_digits")
    fake.write_bytes(pickle.dumps({"head.bias": [0.0] * 10}))
    with pytest.raises(models.CheckpointError, match="pickled checkpoints are never loaded"):
        models.load(fake, arch="mixer_digits")


def test_missing_sidecar_asks_for_an_arch(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file(models.create("mixer_digits").state_dict(), path)
    with pytest.raises(models.CheckpointError, match="pass arch="):
        models.load(path)
    with pytest.raises(models.CheckpointError, match="does not exist"):
        models.load(tmp_path / "absent.safetensors")


def test_unknown_architecture_in_a_sidecar(saved: Path) -> None:
    sidecar = saved.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "arch": "mixer_galactic"}))
    with pytest.raises(models.CheckpointError, match="unknown architecture 'mixer_galactic'"):
        models.read_sidecar(saved)
    sidecar.write_text("{not json")
    with pytest.raises(models.CheckpointError, match="not valid JSON"):
        models.load(saved)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metrics": {"test": {"accuracy": "90%"}}}, r"'metrics\.test\.accuracy': .*valid number"),
        ({"metrics": {"test": {"accuracy": 1.5}}}, r"'metrics\.test\.accuracy': .*less than or"),
        ({"normalisation": {"mean": [0.0], "std": [-1.0]}}, r"'normalisation\.std\.0'"),
        ({"input_shape": [1, 8]}, r"'input_shape': .*at least 3 items"),
        ({"config": {"embed_dim": 10**6}}, r"'config': option 'embed_dim' .*8192"),
        ({"seed": "zero"}, r"'seed': .*valid integer"),
    ],
)
def test_sidecar_fields_have_one_schema(saved: Path, change: dict, message: str) -> None:
    sidecar = saved.with_suffix(".json")
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), **change}))
    with pytest.raises(models.CheckpointError, match=message) as caught:
        models.load(saved)
    assert "\n" not in str(caught.value)


def test_timm_name_with_a_plain_state_dict(tmp_path: Path) -> None:
    reference = timm.create_model("gmlp_ti16_224", img_size=32, num_classes=10).eval()
    path = tmp_path / "gmlp.safetensors"
    save_file(reference.state_dict(), path)
    model, meta = models.load(path, arch="gmlp_ti16_224", img_size=32, num_classes=10)
    x = torch.rand(2, 3, 32, 32)
    assert torch.equal(model(x), reference(x))
    assert meta["arch"] == "gmlp_ti16_224" and meta["family"] == "timm"
    assert meta["weights_sha256"] == models.file_sha256(path)
    # ...and the loaded model can be saved with a sidecar and rebuilt from it alone.
    again, _ = models.load(models.save(model, tmp_path / "gmlp_sidecar.safetensors"))
    assert torch.equal(again(x), reference(x))


def test_models_not_built_by_create_cannot_be_saved(tmp_path: Path) -> None:
    with pytest.raises(models.CheckpointError, match=r"models\.create"):
        models.save(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")


def test_saving_the_same_weights_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    model = models.create("mixer_digits")
    paths = [models.save(model, tmp_path / f"copy{i}.safetensors") for i in range(4)]
    assert len({path.read_bytes() for path in paths}) == 1


def test_save_records_the_dataset_record_it_is_given(tmp_path: Path) -> None:
    """A checkpoint records its data as a plain ``{name, sha256}`` record, checked."""
    model = models.create("mlp_digits")
    record = {"name": "digits:train", "sha256": "ab" * 32}
    path = models.save(model, tmp_path / "a.safetensors", dataset=record)
    assert models.read_sidecar(path)["dataset"] == record
    assert models.read_sidecar(models.save(model, tmp_path / "b"))["dataset"] is None
    for bad in ("digits", tmp_path / "mine.npz", {"name": "digits"}, {"name": 1, "sha256": "x"}):
        with pytest.raises(models.CheckpointError, match="a name and a sha256"):
            models.save(model, tmp_path / "c.safetensors", dataset=bad)
