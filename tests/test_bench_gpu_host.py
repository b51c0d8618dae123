"""The prepared GPU-host measurement (bench/bench_gpu_host.py) works before a GPU is at hand:
its options, the card's peak, and its CPU fallback on tiny inputs, tables written."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_gpu_host", ROOT / "bench/bench_gpu_host.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu_host"] = module
    spec.loader.exec_module(module)
    return module


def test_options_default_to_the_gpu_workload_and_smoke_to_tiny_ones(bench: ModuleType) -> None:
    smoke = bench.parse(["--cpu-smoke", "--images", "16", "--out", "x"])
    assert smoke.cpu_smoke and smoke.images == 16 and smoke.batch == bench.SMOKE["batch"]
    assert smoke.sections == ["forwards", "photos", "training", "capture", "service"]
    assert smoke.out == Path("x")
    assert smoke.pair == bench.SMOKE["pair"] and smoke.train_batch == bench.SMOKE["train_batch"]
    full = bench.parse([])
    if torch.cuda.is_available():
        assert not full.cpu_smoke and full.images == 1024 and full.pair == list(bench.TIMM_PAIR)
        assert full.cifar == 50000 and full.train_batch is None and full.db == "postgresql"
    else:  # without CUDA the run falls back to the smoke, and says so
        assert full.cpu_smoke and full.auto_smoke and full.images == bench.SMOKE["images"]
    for bad in (["--images", "0"], ["--sections", "nothing"], ["--db", "mysql"]):
        with pytest.raises(SystemExit) as stop:
            bench.parse(bad)
        assert stop.value.code == 2


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", None),
    ],
)
def test_the_card_is_named_and_its_peak_found(bench: ModuleType, name: str, row: str) -> None:
    assert bench.card_model(name) == row
    top, kind, source = bench.peak(name, "bf16")
    assert kind == "bf16 tensor"
    if row is None:
        assert (top, source) == (None, "unknown card")
    else:
        assert top == bench.PEAKS[row]["bf16"] and "datasheet" in source
        fp32, fp32_kind, _ = bench.peak(name, "fp32")  # torch's default: no TF32 in matmuls
        assert fp32_kind == "fp32 (no tensor cores)" and fp32 == bench.PEAKS[row]["fp32"]


@pytest.mark.slow
def test_the_cpu_fallback_writes_its_figures(bench: ModuleType, tmp_path: Path) -> None:
    sections = ["forwards", "training", "photos", "capture"]
    argv = ["--cpu-smoke", "--sections", *sections, "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "gpu_host.json").read_text())
    assert data["mode"] == "cpu-smoke" and data["device_name"] == "CPU"
    forwards = data["sections"]["forwards"]
    assert [r["dtype"] for r in forwards["rows"]] == ["bf16", "fp32"]
    assert forwards["pair"] == bench.SMOKE["pair"] and forwards["input"] == [3, 160, 160]
    for row in forwards["rows"]:
        assert row["ratio"] == pytest.approx(row["atlas_s_per_1000"] / row["bare_s_per_1000"])
        assert row["peak_tflops"] is None and row["peak_source"] == "unknown card"
    assert forwards["gflop_per_image"] > 0 and forwards["layers"] > 2
    rows = data["sections"]["training"]["rows"]
    assert [(r["preset"], r["precision"]) for r in rows[:4]] == [
        ("mixer_digits", "fp32"),
        ("mixer_digits", "fp32"),
        ("mixer_digits", "bf16"),
        ("mixer_digits", "fp32"),
    ]
    digits = rows[0]
    assert digits["recorded"] == {
        "device": "cpu",
        "device_name": digits["recorded"]["device_name"],
        "precision": "fp32",
        "deterministic": True,
    }
    assert not digits["extrapolated"] and digits["steps"] == 4  # 32 training images, batch 8
    cifar_cpu = rows[-1]
    assert cifar_cpu["preset"] == "mixer_cifar" and cifar_cpu["extrapolated"]
    assert cifar_cpu["steps_timed"] == 1 and cifar_cpu["speedup"] == 1.0
    assert data["sections"]["training"]["bit_identical"] == {"mixer_digits": True}
    photos = data["sections"]["photos"]
    assert [r["job"] for r in photos["rows"]] == [
        "tensors",
        "photos, warm",
        "photos, cold",
        "photos, no cache",
    ]
    assert photos["images"] == bench.SMOKE["images"] and photos["rows"][0]["ratio"] == 1.0
    assert data["sections"]["capture"]["skipped"].startswith("needs a CUDA device")
    table = (tmp_path / "gpu_host.md").read_text()
    assert "| photos, warm |" in table and "*capture skipped:* needs a CUDA device" in table
    assert "| dtype | atlas s/1000 img | bare forwards s/1000 img | ratio |" in table
    assert "| mixer_cifar | cifar-shaped | cpu | fp32 | 1 of 3 |" in table
