"""The heatmap renderer and the ``compare`` subcommand, end to end on small checkpoints."""

from __future__ import annotations

import json
import types
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


def _block_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """Each block's output, flattened per image, read with plain forward hooks."""
    outs: list[np.ndarray] = []
    hooks = [
        block.register_forward_hook(lambda _m, _i, o: outs.append(o.flatten(1).double().numpy()))
        for block in model.blocks  # type: ignore[union-attr]
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return outs


def test_compare_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ref: types.SimpleNamespace
) -> None:
    import models
    from analysis import load_dataset
    from app.cli import main

    # Two differently initialised networks: CKA between them is not 1, and must equal the
    # minibatch unbiased CKA of their block outputs computed by the reference in conftest.
    nets = [models.create("mixer_digits", seed=seed) for seed in (0, 1)]
    paths = [models.save(m, tmp_path / f"net{i}.safetensors") for i, m in enumerate(nets)]
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

    x = torch.from_numpy(load_dataset("digits").x).float()
    feats = [_block_outputs(m.eval(), x) for m in nets]
    expected = ref.cka_matrix(feats[0], feats[1], batch_size=128)
    got = atlas.matrix("net0", "net1")[: len(feats[0]), : len(feats[1])]
    assert np.abs(expected - np.eye(len(expected))).max() > 0.05  # not trivially identical
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_compare_cli_reports_bad_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    models = pytest.importorskip("models")
    from app.cli import main

    path = models.save(models.create("mixer_digits"), tmp_path / "net.safetensors")
    assert main(["compare", str(path), "--dataset", "digits", "--layers", "nope*"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: layer selection 'nope*' matches no layer") and "stem" in err
