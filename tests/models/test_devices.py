"""Where a training runs: the device and precision are checked once, the sidecar says where and
how it ran, and runs on one device are bit-identical (CUDA ones where a GPU is at hand)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import models
from analysis import ImageDataset, load_dataset
from app.cli import main
from models import training
from models.step_capture import HOST_REASON

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")


@pytest.fixture(scope="module")
def small_digits() -> ImageDataset:
    full = load_dataset("digits", split="train")
    return ImageDataset(name="digits-small", x=full.x[:240], y=full.y[:240])


def _training(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.with_suffix(".json").read_text())["training"]
    return record


def _sha(path: Path) -> str:
    return str(json.loads(path.with_suffix(".json").read_text())["weights_sha256"])


def test_a_cpu_training_records_where_and_how_it_ran(
    small_digits: ImageDataset, tmp_path: Path
) -> None:
    on_cpu = training.train(
        "mixer_digits", small_digits, epochs=1, seed=2, device="cpu", out_dir=tmp_path / "a"
    )
    default = training.train("mixer_digits", small_digits, epochs=1, seed=2, out_dir=tmp_path / "b")
    record = _training(on_cpu)
    assert record["seed"] == 2 and record["device"] == "cpu" and record["precision"] == "fp32"
    assert record["deterministic"] is True and record["torch_version"] == torch.__version__
    assert record["cuda_version"] is None and record["cublas_workspace_config"] is None
    assert isinstance(record["device_name"], str) and record["device_name"]
    assert record["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert record["step_capture"] == f"eager: {HOST_REASON}"  # the host captures nothing
    # The library's default is the host: the same run, the same weights.
    assert _training(default)["device"] == "cpu" and _sha(default) == _sha(on_cpu)


def test_bf16_trains_on_the_cpu_reproducibly(small_digits: ImageDataset, tmp_path: Path) -> None:
    runs = [
        training.train(
            "mixer_digits", small_digits, epochs=1, precision=p, out_dir=tmp_path / f"{p}{i}"
        )
        for i, p in enumerate(("bf16", "bf16", "fp32"))
    ]
    assert _training(runs[0])["precision"] == "bf16" and _training(runs[0])["deterministic"]
    assert _sha(runs[0]) == _sha(runs[1]) != _sha(runs[2])  # autocast changed the arithmetic
    model, _ = models.load(runs[0])
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 weights all along


@pytest.mark.parametrize(
    ("device", "precision", "message"),
    [
        ("tpu", "fp32", "unknown device 'tpu': use 'cpu', 'cuda' or 'cuda:<index>'"),
        ("mps", "fp32", "unknown device 'mps'"),
        ("cpu", "fp16", "precision must be 'fp32' or 'bf16', not 'fp16'"),
        ("cuda:99", "fp32", "'cuda:99'"),
    ],
)
def test_a_device_or_precision_that_cannot_be_used_is_refused_before_any_work(
    device: str, precision: str, message: str, small_digits: ImageDataset, tmp_path: Path
) -> None:
    with pytest.raises(models.ConfigError, match=message):
        training.train(
            "mlp_digits",
            small_digits,
            epochs=1,
            device=device,
            precision=precision,
            out_dir=tmp_path,
        )
    assert list(tmp_path.iterdir()) == []


@no_cuda
def test_cuda_without_a_gpu_is_one_sentence(
    small_digits: ImageDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(models.ConfigError, match="sees no CUDA device on this machine"):
        training.train("mlp_digits", small_digits, device="cuda", out_dir=tmp_path)
    argv = ["train", "--arch", "mlp_digits", "--device", "cuda", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device 'cuda' was asked for, but torch") and err.count("\n") == 1


def test_an_operation_without_a_deterministic_kernel_trains_without_and_says_so(
    small_digits: ImageDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_unpool1d has no deterministic implementation (torch refuses it on every device when
    deterministic algorithms are on): the run restarts without them and records why."""
    create = training.create
    refused: list[bool] = []

    def with_unpool(arch: str, **options: Any) -> torch.nn.Module:
        model = create(arch, **options)

        def unpool(module: torch.nn.Module, args: Any) -> None:
            refused.append(torch.are_deterministic_algorithms_enabled())
            pooled, where = F.max_pool1d(torch.ones(1, 1, 4), 2, return_indices=True)
            F.max_unpool1d(pooled, where, 2)

        model.register_forward_pre_hook(unpool)
        return model

    monkeypatch.setattr(training, "create", with_unpool)
    path = training.train("mlp_digits", small_digits, epochs=1, out_dir=tmp_path)
    record = _training(path)
    assert record["deterministic"] is False
    assert "does not have a deterministic implementation" in record["nondeterministic"]
    assert refused[0] is True and refused[-1] is False  # refused once, then run without
    assert not torch.are_deterministic_algorithms_enabled()  # the process's setting is back


@cuda
def test_cuda_runs_record_the_gpu_and_repeat_bit_for_bit(
    small_digits: ImageDataset, tmp_path: Path
) -> None:
    runs = [
        training.train(
            arch, small_digits, epochs=1, seed=1, device="cuda", out_dir=tmp_path / f"{arch}{i}"
        )
        for arch in ("mixer_digits", "rp_mixer_digits")
        for i in range(2)
    ]
    record = _training(runs[0])
    assert record["device"] == f"cuda:{torch.cuda.current_device()}"
    assert record["device_name"] == torch.cuda.get_device_name()
    assert record["cuda_version"] == torch.version.cuda and record["deterministic"] is True
    # each step after the warm-up replayed from one CUDA graph, and still bit for bit; an
    # architecture whose step cannot be captured says why, the same in both runs
    captured = [_training(r)["step_capture"] for r in runs]
    assert captured[:2] == ["cuda_graph"] * 2 and captured[2] == captured[3]
    assert captured[2] == "cuda_graph" or captured[2].startswith("eager: capture failed: ")
    assert _sha(runs[0]) == _sha(runs[1]) and _sha(runs[2]) == _sha(runs[3])
    bf16 = training.train(
        "mixer_digits", small_digits, epochs=1, device="cuda", precision="bf16", out_dir=tmp_path
    )
    assert _training(bf16)["precision"] == "bf16"
    assert _training(bf16)["step_capture"] == "cuda_graph"
