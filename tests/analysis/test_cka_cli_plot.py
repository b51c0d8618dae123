"""The heatmap renderer and the ``compare`` subcommand, end to end on small checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.mlp_mixer import MlpMixer

from analysis import Atlas, compare
from analysis.plot import render_atlas


@pytest.fixture(scope="module")
def atlas() -> Atlas:
    torch.manual_seed(0)
    models = {
        f"m{i}": MlpMixer(num_classes=10, img_size=16, patch_size=4, embed_dim=16, num_blocks=2)
        for i in range(2)
    }
    x = torch.randn(40, 3, 16, 16)
    models["m1"].blocks[1] = torch.nn.Identity()  # a hook-free change; still defined
    return compare(models, x, batch_size=20)


@pytest.mark.parametrize(("fmt", "magic"), [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_render_atlas(atlas: Atlas, fmt: str, magic: bytes) -> None:
    data = render_atlas(atlas, fmt)
    assert data.startswith(magic)
    assert render_atlas(atlas, fmt) == data  # deterministic: no timestamps
    with pytest.raises(ValueError):
        render_atlas(atlas, "gif")


def test_compare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = pytest.importorskip("models")
    from app.cli import main

    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = models.create("mixer_digits")
        paths.append(models.save(model, tmp_path / f"net{seed}.safetensors"))
    out, png = tmp_path / "atlas.json", tmp_path / "grid.png"
    argv = [*map(str, paths), "--dataset", "digits", "--layers", "blocks.*", "pre_logits"]
    argv += ["--batch-size", "128", "--out", str(out), "--heatmap", str(png)]
    assert main(["compare", *argv]) == 0
    printed = capsys.readouterr().out
    assert "net0  net1" in printed and "mean diagonal CKA" in printed
    atlas = Atlas.from_dict(json.loads(out.read_text()))
    assert atlas.models == ["net0", "net1"]
    assert atlas.layers["net0"][-1] == "pre_logits"
    assert np.allclose(np.diag(atlas.matrix("net0")), 1.0)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_compare_cli_reports_bad_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = pytest.importorskip("models")
    from app.cli import main

    path = models.save(models.create("mixer_digits"), tmp_path / "net.safetensors")
    assert main(["compare", str(path), "--dataset", "digits", "--layers", "nope*"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: layer selection 'nope*' matches no layer") and "stem" in err
