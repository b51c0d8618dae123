"""Image files decoded once per pipeline (analysis.data.decoded): the cached pixels give the
pipeline's own numbers, a second comparison decodes nothing, and the pool follows the thread
count."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import analysis
from analysis.data import decoded as decoded_module
from analysis.data import images as images_module
from analysis.data.decoded import DecodedImages, DirectoryDecodedCache, decoded_key
from analysis.data.gpu_jpeg import is_jpeg, jpeg_decoder
from analysis.data.images import ImageFiles
from analysis.data.preprocessing import ModelInput

CROPPED: dict[str, Any] = {
    "input_size": [3, 12, 12],
    "interpolation": "bicubic",
    "crop_pct": 0.875,
    "crop_mode": "center",
    "mean": [0.5, 0.4, 0.3],
    "std": [0.2, 0.3, 0.25],
}
WHOLE: dict[str, Any] = CROPPED | {
    "input_size": [3, 8, 8],
    "interpolation": "bilinear",
    "crop_pct": 1.0,
}


def _photos(n: int = 10) -> ImageFiles:
    """JPEG and PNG files of several sizes and modes (RGB, grayscale, palette)."""
    rng = np.random.default_rng(0)
    blobs = []
    for i in range(n):
        h, w = 10 + 3 * i, 17 - i
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        if i % 3 == 1:
            image = image.convert("L")
        elif i % 3 == 2:
            image = image.convert("P")
        buf = io.BytesIO()
        image.save(buf, format="PNG" if i % 3 == 2 else "JPEG")
        blobs.append(buf.getvalue())
    sizes = tuple(Image.open(io.BytesIO(b)).size for b in blobs)
    return ImageFiles(
        "photos", tuple(blobs), tuple(f"{i}.jpg" for i in range(n)), None, None, 3, sizes
    )


def test_cached_pixels_give_the_pipelines_numbers_to_the_bit() -> None:
    """Resize and crop to uint8, then ÷ 255 and normalise on the batch: timm's transform."""
    files = _photos()
    for pipeline in (CROPPED, WHOLE):
        made = ModelInput(pipeline)
        want = torch.stack([made.image(files.image(i)) for i in range(len(files))])
        pixels = torch.from_numpy(
            np.stack([made.pixels(files.image(i)) for i in range(len(files))])
        )
        assert pixels.dtype == torch.uint8 and pixels.shape == (len(files), *pipeline["input_size"])
        assert torch.equal(made.from_pixels(pixels), want)


def _net(seed: int, pipeline: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(seed)
    c, h, w = pipeline["input_size"]
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(c * h * w, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4)
    )
    net.atlas_preprocessing = dict(pipeline)  # type: ignore[assignment]
    return net


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = images_module.open_image

    def counted(*args: Any, **kwargs: Any) -> Image.Image:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(images_module, "open_image", counted)
    return calls


def test_a_second_comparison_decodes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models share a resize and crop (one of them normalising otherwise), a third has its
    own: the first comparison decodes every file once per distinct resize and crop, a second
    one (a new cache object on the same directory, as after a restart) none, and both give the
    atlas of a comparison without a cache."""
    files = _photos()
    renormalised = CROPPED | {"mean": [0.1, 0.2, 0.3], "std": [1.0, 0.5, 0.25]}
    nets = {"a": _net(0, CROPPED), "b": _net(1, renormalised), "c": _net(2, WHOLE)}
    plain = analysis.compare(nets, files, batch_size=5, device="cpu")
    calls = _count_decodes(monkeypatch)
    first = analysis.compare(
        nets, files, batch_size=5, device="cpu", decoded_cache=DirectoryDecodedCache(tmp_path)
    )
    assert len(calls) == 2 * len(files)
    stored = sorted(p.name for p in tmp_path.rglob("*.npy"))
    assert stored == sorted(
        f"{decoded_key(files.sha256, ModelInput(p).pixel_key, p['input_size'])}.npy"
        for p in (CROPPED, WHOLE)
    )
    calls.clear()
    second = analysis.compare(
        nets, files, batch_size=5, device="cpu", decoded_cache=DirectoryDecodedCache(tmp_path)
    )
    assert calls == []
    np.testing.assert_array_equal(first.hsic, plain.hsic)
    np.testing.assert_array_equal(second.hsic, plain.hsic)


def test_the_cache_survives_a_new_object_and_is_read_mapped(tmp_path: Path) -> None:
    pixels = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
    key = decoded_key("f" * 64, "pipe", (3, 4, 5))
    DirectoryDecodedCache(tmp_path).put(key, pixels)
    found = DirectoryDecodedCache(tmp_path).get(key)
    assert isinstance(found, np.memmap) and np.array_equal(found, pixels)
    assert DirectoryDecodedCache(tmp_path).get(decoded_key("e" * 64, "pipe", (3, 4, 5))) is None
    assert not list(tmp_path.rglob("*.tmp"))
    with pytest.raises(ValueError, match="hex digests"):
        DirectoryDecodedCache(tmp_path).get("../../etc")


def test_the_decoding_pool_follows_the_threads_of_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker sets each job thread's torch count by its CPU rule; decoding takes that many."""
    sizes: list[int] = []
    real = ThreadPoolExecutor

    def recording(max_workers: int, **kwargs: Any) -> Any:
        sizes.append(max_workers)
        return real(max_workers=max_workers, **kwargs)

    monkeypatch.setattr(decoded_module, "ThreadPoolExecutor", recording)  # the pool it makes
    files = _photos()
    made = ModelInput(CROPPED)

    def job(threads: int) -> None:
        torch.set_num_threads(threads)  # as app.jobs.threads.job_threads does per job thread
        DecodedImages(files, DirectoryDecodedCache(tmp_path / str(threads))).dataset(
            made.pixel_key, made.shape, made.pixels
        )

    for threads in (3, 1):
        worker = threading.Thread(target=job, args=(threads,))
        worker.start()
        worker.join()
    assert sizes == [3]  # one thread decodes in the calling thread, with no pool


def test_jpeg_files_go_to_the_gpu_decoder_when_one_is_given(tmp_path: Path) -> None:
    """A stand-in for nvJPEG (Pillow, RGB, as decode_jpeg gives): it gets every JPEG file in
    chunks, the host the rest; the pixels are kept under a key of their own."""
    files = _photos()
    chunks: list[int] = []

    def decoder(blobs: Any) -> list[Image.Image]:
        chunks.append(len(blobs))
        return [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]

    made = ModelInput(CROPPED)
    jpegs = sum(is_jpeg(b) for b in files.blobs)
    assert 0 < jpegs < len(files)  # the palette images are PNGs
    on_gpu = DecodedImages(files, DirectoryDecodedCache(tmp_path), jpeg=decoder)
    on_gpu.JPEG_CHUNK = 3
    pixels = on_gpu.dataset(made.pixel_key, made.shape, made.pixels)
    assert chunks == [3] * (jpegs // 3) + ([jpegs % 3] if jpegs % 3 else [])
    host = DecodedImages(files, DirectoryDecodedCache(tmp_path))
    assert np.array_equal(host.dataset(made.pixel_key, made.shape, made.pixels), pixels)
    assert len(list(tmp_path.rglob("*.npy"))) == 2  # one per decoder


def test_without_cuda_there_is_no_gpu_decoder_and_the_host_decodes(tmp_path: Path) -> None:
    decoder, why = jpeg_decoder(torch.device("cpu"))
    assert decoder is None and why == "cpu is not a CUDA device"
    files, nets = _photos(), {"a": _net(0, CROPPED)}
    plain = analysis.compare(nets, files, batch_size=5, device="cpu")
    cache = DirectoryDecodedCache(tmp_path)
    asked = analysis.compare(
        nets, files, batch_size=5, device="cpu", decoded_cache=cache, gpu_jpeg=True
    )
    np.testing.assert_array_equal(asked.hsic, plain.hsic)
    assert len(list(tmp_path.rglob("*.npy"))) == 1
