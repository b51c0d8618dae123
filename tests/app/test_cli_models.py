"""Models by name on the command line: `compare` and `layers` take a checkpoint file or a model
of the store by id, name or alias; `models` lists the store's; a name no model has, and a layer
no model has, are refused in one line that says which command lists them (issue 47)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.cli import main
from app.http.main import create_app
from app.store.settings import Settings
from tests.helpers import upload


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zoo: dict[str, Path]) -> dict[str, int]:
    """A store under tmp_path/var holding mixer_digits (alias my_mixer) and sw_mlp_digits,
    uploaded over REST; the commands run in tmp_path. The models' ids by name."""
    for name in [n for n in os.environ if n.startswith("CKA_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CKA_DEVICE", "cpu")
    settings = Settings(data_dir=tmp_path / "var", worker_threads=0, allowed_hosts="testserver")
    ids = {}
    with TestClient(create_app(settings, start_worker=False)) as client:
        for name in ("mixer_digits", "sw_mlp_digits"):
            ids[name] = upload(client, zoo[name]).json()["id"]
        assert upload(client, zoo["mixer_digits"], name="my_mixer").status_code == 200
    return ids


def test_compare_and_layers_take_models_of_the_store_by_name_alias_or_id(
    tmp_path: Path, store: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split() == ["id", "name", "arch", "aliases"]
    assert listed[1].split() == [
        str(store["mixer_digits"]),
        "mixer_digits",
        "mixer_digits",
        "my_mixer",
    ]
    assert listed[2].split() == [str(store["sw_mlp_digits"]), "sw_mlp_digits", "sw_mlp_digits"]

    out = tmp_path / "atlas.json"
    argv = ["compare", "my_mixer", str(store["sw_mlp_digits"]), "--dataset", "digits"]
    assert main([*argv, "--batch-size", "150", "--out", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["models"] == ["mixer_digits", "sw_mlp_digits"]
    capsys.readouterr()

    assert main(["layers", "mixer_digits"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("mixer_digits: ") and "* blocks.0" in shown
    assert "  blocks.0.mlp_tokens.fc1" in shown


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["layers", "mixr_digits"],
            "error: no model is named 'mixr_digits'; `cka-atlas models` lists the store's models",
        ),
        (
            ["compare", "mixer_digits", "--dataset", "digits", "--layers", "blocks.9"],
            "error: layer selection 'blocks.9' matches no layer of mixer_digits; closest: "
            "blocks.3, blocks.2, blocks.1; its 80 layers: stem, stem.proj, stem.norm, blocks, "
            "blocks.0–blocks.3, blocks.*.norm1, blocks.*.mlp_tokens, blocks.*.drop_path, "
            "blocks.*.norm2, blocks.*.mlp_channels, norm, head_drop, pre_logits, head and the "
            "modules inside them (blocks.*.mlp_tokens.fc1, …); `cka-atlas layers mixer_digits` "
            "lists them all",
        ),
    ],
)
def test_a_wrong_name_says_which_command_lists_them(
    store: dict[str, int], capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [error]
