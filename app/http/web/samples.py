"""Sample images of a dataset, rendered server-side as PNG with Pillow.

Images are scaled up by an integer factor with nearest-neighbour resampling, so an 8×8
digit stays a crisp 8×8 grid of pixels rather than a blur.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

__all__ = ["MIN_SIDE", "render_sample"]

MIN_SIDE = 96


def _to_uint8(image: np.ndarray) -> np.ndarray:
    """(C, H, W) floats to (H, W) or (H, W, 3) bytes; [0, 1] data as is, else min-max scaled."""
    x = np.asarray(image, dtype=np.float64)
    if x.ndim == 2:
        x = x[None]
    lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
    if lo < 0.0 or hi > 1.0:
        x = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    x = np.nan_to_num(np.clip(x, 0.0, 1.0))
    out = np.round(x * 255).astype(np.uint8)
    if out.shape[0] == 3:
        return np.ascontiguousarray(out.transpose(1, 2, 0))
    return out[0]


def render_sample(image: np.ndarray, min_side: int = MIN_SIDE) -> bytes:
    """PNG bytes of one (C, H, W) image, upscaled so its longer side is at least ``min_side``."""
    pixels = _to_uint8(image)
    img = Image.fromarray(pixels)  # "L" for (H, W), "RGB" for (H, W, 3)
    factor = max(1, -(-min_side // max(img.size)))
    if factor > 1:
        img = img.resize((img.width * factor, img.height * factor), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()
