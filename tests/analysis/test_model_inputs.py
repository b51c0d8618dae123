"""Real timm models: class-token feature policies, and Gram store keys that include the pipeline."""

from __future__ import annotations

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
