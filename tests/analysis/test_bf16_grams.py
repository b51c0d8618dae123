"""With ``dtype: bf16`` the selected layers' features stay bf16 and their Grams are summed in
float32 (CPU autocast here; cuBLAS on a GPU): the same atlas as from float32 copies of the
features, and within the bf16 agreement bound of the float32 atlas."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

import analysis
import models
from analysis.engine import streaming
from analysis.estimators.kernels import gram, parse_kernel

AGREEMENT = 2e-4  # BENCHMARKS: the bf16 atlas against the fp32 one, per cell


def _pair() -> dict[str, torch.nn.Module]:
    """Two copies of one small MLP: a forward whose bf16 rounding keeps every cell within the
    bound (the bound is the forward pass's; other random networks here differ by up to 1e-3)."""
    torch.manual_seed(0)
    return {"a": models.create("mlp_digits"), "b": models.create("mlp_digits")}


def _worst(x: analysis.Atlas, y: analysis.Atlas) -> float:
    return max(
        float(np.nanmax(np.abs(np.asarray(x.matrix(p, q)) - np.asarray(y.matrix(p, q)))))
        for p, q in itertools.combinations_with_replacement(x.models, 2)
    )


def test_a_bf16_gram_is_summed_in_float32() -> None:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(40, 300)).astype(np.float32)).bfloat16()
    exact = x.double() @ x.double().T  # bf16 values are exact in float64
    for kernel in ("linear", "rbf"):
        got = gram(x, parse_kernel(kernel))
        assert got.dtype == torch.float32
    got = gram(x, parse_kernel("linear"))
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=1e-4)
    out = torch.empty(40, 40)
    assert gram(x, parse_kernel("linear"), out=out) is out and torch.equal(out, got)


def test_the_bf16_atlas_forms_its_grams_from_bf16_features(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nets, x = _pair(), torch.from_numpy(analysis.load_dataset("digits").x[:256])
    fp32 = analysis.compare(nets, x, batch_size=128, device="cpu")
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    real = streaming.gram

    def recorded(f: torch.Tensor, kernel: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        result = real(f, kernel, out=out)
        seen.append((f.dtype, result.dtype))
        return result

    monkeypatch.setattr(streaming, "gram", recorded)
    bf16 = analysis.compare(nets, x, batch_size=128, device="cpu", dtype="bf16")
    assert seen and set(seen) == {(torch.bfloat16, torch.float32)}
    assert bf16.config["dtype"] == "bfloat16"
    assert _worst(bf16, fp32) <= AGREEMENT
    # as the engine did before: every feature copied to float32 (and shifted) first
    monkeypatch.setattr(streaming, "LOW_PRECISION", ())
    seen.clear()
    copied = analysis.compare(nets, x, batch_size=128, device="cpu", dtype="bf16")
    assert set(seen) == {(torch.float32, torch.float32)}
    assert _worst(bf16, copied) <= 1e-5
