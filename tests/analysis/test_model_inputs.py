"""Real timm models: class-token feature policies, Gram store keys that include the pipeline, and
arrays of another size than a model's input, which go through its pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import analysis
from analysis.errors import LayerError
from analysis.layers import LayerReader, default_layers


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, depth=2, num_classes=3, pretrained=False
    ).eval()


def test_prefix_token_policies_read_the_block_output() -> None:
    vit = _vit()
    x = torch.randn(5, 3, 32, 32)
    seen: list[torch.Tensor] = []
    handle = vit.blocks[1].register_forward_hook(lambda _m, _i, o: seen.append(o))
    with torch.no_grad():
        vit(x)
    handle.remove()
    tokens = seen[0]  # (5, 1 + 4 patches, 192)
    with torch.no_grad():
        cls = LayerReader(vit, ["blocks.1"], "cls")(x)[0]
        mean = LayerReader(vit, ["blocks.1"], "mean_tokens")(x)[0]
        flat = LayerReader(vit, ["blocks.1"], "flatten")(x)[0]
    torch.testing.assert_close(cls, tokens[:, 0])
    torch.testing.assert_close(mean, tokens[:, 1:].mean(1))
    torch.testing.assert_close(flat, tokens.reshape(5, -1))
    assert flat.shape == (5, 5 * 192)


def test_cls_is_recorded_and_refused_without_a_class_token() -> None:
    vit = _vit()
    atlas = analysis.compare({"vit": vit}, torch.rand(8, 3, 32, 32), feature="cls", batch_size=8)
    assert atlas.config["feature"] == "cls"
    mixer = timm.create_model("mixer_s16_224", img_size=32, pretrained=False)
    mixer.atlas_config = {"arch": "mixer_s16_224", "family": "timm", "config": {}}
    assert default_layers(mixer) == [f"blocks.{i}" for i in range(8)]
    with pytest.raises(LayerError, match="class token"):
        LayerReader(mixer, ["blocks.0"], "cls")


def test_stored_grams_are_keyed_by_the_input_pipeline(tmp_path: object) -> None:
    """The same weights behind another pipeline see other inputs: no stored Gram is reused."""
    import models
    from models.preprocessing import pipeline_from_spec

    net = models.create("mlp_digits")
    cache = analysis.DirectoryGramCache(tmp_path)  # type: ignore[arg-type]
    x = torch.rand(16, 1, 8, 8)

    def run(mean: float, std: float) -> dict[str, int]:
        net.atlas_preprocessing = pipeline_from_spec([1, 8, 8], [mean], [std])  # type: ignore[assignment]
        atlas = analysis.compare(
            {"m": net}, x, batch_size=8, gram_cache=cache, model_keys={"m": "w"}
        )
        stats: dict[str, int] = atlas.diagnostics["gram_cache"]
        return stats

    assert run(0.0, 1.0)["misses"] == 2
    assert run(0.5, 0.25)["misses"] == 2  # a new pipeline: computed again
    assert run(0.0, 1.0)["hits"] == 2


def _mixer(img_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("mixer_s16_224", img_size=img_size, num_classes=10).eval()


def _first_inputs(nets: dict[str, torch.nn.Module], data: object) -> tuple[dict, dict]:
    """What each net's stem received first (image 0), and the atlas's record of the input."""
    from tests.hub_helpers import StemRecorder

    recorders = {name: StemRecorder(net) for name, net in nets.items()}
    try:
        atlas = analysis.compare(nets, data, batch_size=6, device="cpu")  # type: ignore[arg-type]
    finally:
        for rec in recorders.values():
            rec.close()
    return {name: rec.first for name, rec in recorders.items()}, atlas.config["input"]


def test_arrays_of_another_size_go_through_the_models_pipeline(tmp_path: Path) -> None:
    """A 64-px array against a 224-px timm model: resized, cropped and normalised as the same
    images decoded from PNG files would be; the 64-px model reads it as it is (normalised);
    the value range comes from uint8, a declaration or the values, and is recorded."""
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    nets = {"big": _mixer(224), "small": _mixer(64)}
    pixels = np.random.default_rng(0).integers(0, 256, size=(6, 64, 64, 3), dtype=np.uint8)
    transform = create_transform(**resolve_data_config({}, model=nets["big"]))
    as_png = transform(Image.fromarray(pixels[0], "RGB"))  # timm's own eval transform
    assert as_png.shape == (3, 224, 224)
    as_is = (torch.from_numpy(pixels[0]).permute(2, 0, 1) / 255.0 - 0.5) / 0.5
    record = {"images": "array", "shape": [3, 64, 64], "pipeline": ["big"], "as_is": ["small"]}

    np.savez(tmp_path / "u8.npz", x=pixels)
    seen, said = _first_inputs(nets, tmp_path / "u8.npz")
    assert torch.equal(seen["big"], as_png)
    torch.testing.assert_close(seen["small"], as_is)
    assert said == record | {"value_range": {"low": 0.0, "high": 255.0, "from": "uint8"}}

    floats = torch.from_numpy(pixels.astype(np.float32)).permute(0, 3, 1, 2).contiguous()
    seen, said = _first_inputs({"big": nets["big"]}, floats)  # 0–255 floats, inferred
    assert torch.equal(seen["big"], as_png)
    assert said["value_range"] == {"low": 0.0, "high": 255.0, "from": "inferred"}

    # 0.1 is black and 0.9 white: the values fit [0, 1], but the declaration says otherwise
    np.savez(tmp_path / "declared.npz", x=floats.numpy() / 255 * 0.8 + 0.1, value_range=[0.1, 0.9])
    seen, said = _first_inputs({"big": nets["big"]}, tmp_path / "declared.npz")
    assert torch.equal(seen["big"], as_png)
    assert said["value_range"] == {"low": 0.1, "high": 0.9, "from": "declared"}
