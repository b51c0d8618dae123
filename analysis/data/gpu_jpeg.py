"""JPEG files decoded on a CUDA device (nvJPEG, through ``torchvision.io.decode_jpeg``).

An opt-in for filling the decoded-image cache (:mod:`analysis.data.decoded`) on a GPU host
whose cores are few for its card: the card decodes the JPEG files of a dataset in chunks, the
host resizes and crops them as every pipeline does. nvJPEG's inverse DCT is not libjpeg's, so
its pixels may differ from Pillow's by a level or so: they are kept under their own key, and
a comparison that asks for them (``gpu_jpeg=True``) reads only those. Whether it is faster
depends on the card and the host's cores (``bench/bench_gpu_host.py``'s ``photos`` section
times it); it is off unless asked for. :func:`jpeg_decoder` probes the device once and says why
it cannot be used: not a CUDA device, no ``decode_jpeg`` in torchvision, or the probe failing.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np
import torch
from PIL import Image

__all__ = ["JPEG_MAGIC", "JpegDecoder", "is_jpeg", "jpeg_decoder"]

JPEG_MAGIC = b"\xff\xd8\xff"
JpegDecoder = Callable[[Sequence[bytes]], list[Image.Image]]


def is_jpeg(blob: bytes) -> bool:
    """Whether a file's bytes start as a JPEG's do."""
    return blob[:3] == JPEG_MAGIC


@cache
def _probe() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def jpeg_decoder(device: torch.device) -> tuple[JpegDecoder | None, str]:
    """(a decoder of JPEG files to RGB images on ``device``, "nvjpeg"), or (None, why not)."""
    if device.type != "cuda":
        return None, f"{device} is not a CUDA device"
    try:
        from torchvision.io import ImageReadMode, decode_jpeg  # type: ignore[import-untyped]
    except ImportError:
        return None, "this torchvision has no decode_jpeg"

    def decode(blobs: Sequence[bytes]) -> list[Image.Image]:
        data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return [Image.fromarray(im.permute(1, 2, 0).cpu().numpy(), "RGB") for im in images]

    try:
        decode([_probe()])
    except Exception as exc:  # no nvJPEG in this build, a driver that refuses: the host decodes
        lines = str(exc).strip().splitlines()
        return None, f"decode_jpeg on {device} failed: {lines[0] if lines else type(exc).__name__}"
    return decode, "nvjpeg"
