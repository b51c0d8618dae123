"""What an array's numbers mean as pixels: the values that stand for black and for white.

A model's input pipeline (:mod:`analysis.data.preprocessing`) reads pixels in [0, 1], as an
image file decodes to. An array that must be resized for a model is first mapped from its
*value range* to [0, 1]. The range is

- ``uint8``: integer images, 0–255, already scaled to [0, 1] when they were read;
- ``declared``: given with the data (an ``.npz``'s ``value_range`` array, or
  :class:`analysis.ImageDataset`'s ``value_range``);
- ``inferred`` otherwise, from the data's smallest and largest value: the first of [0, 1],
  [-1, 1] and [0, 255] that holds them all, else the data's own [min, max].

Whichever it is, a comparison states it (the atlas's ``config["input"]``, a stored comparison's
provenance).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from analysis.errors import DatasetError

__all__ = ["STANDARD_RANGES", "ValueRange", "declared_range", "infer_range"]

# The usual conventions of pixel arrays, in the order inference tries them.
STANDARD_RANGES = ((0.0, 1.0), (-1.0, 1.0), (0.0, 255.0))
RangeSource = Literal["uint8", "declared", "inferred"]


@dataclass(frozen=True)
class ValueRange:
    """The values that stand for black (``low``) and white (``high``), and where that was
    learnt (``source``: see the module docstring)."""

    low: float
    high: float
    source: RangeSource

    def as_dict(self) -> dict[str, Any]:
        """The range as a comparison records it, in the data's own values (uint8: 0–255,
        though the images were scaled to [0, 1] when read): ``{"low", "high", "from"}``."""
        high = 255.0 if self.source == "uint8" else self.high
        return {"low": self.low, "high": high, "from": self.source}


def declared_range(value: Any, where: str) -> ValueRange:
    """A range given with the data: two finite numbers, low below high; else a DatasetError
    naming ``where`` it came from."""
    try:
        low, high = (float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1))
    except (TypeError, ValueError):
        raise DatasetError(
            f"the value range of {where} must be two numbers [low, high], not {value!r}."
        ) from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise DatasetError(
            f"the value range of {where} must be two finite numbers with low < high, "
            f"not [{low}, {high}]."
        )
    return ValueRange(low, high, "declared")


def infer_range(parts: Iterable[Any]) -> ValueRange:
    """The range of data given as ``parts`` (arrays or tensors, e.g. slices of a large array),
    read once: the first standard range that holds every value, else their own [min, max]."""
    low, high = math.inf, -math.inf
    for part in parts:
        values = part.detach().cpu().numpy() if hasattr(part, "detach") else np.asarray(part)
        if values.size:
            low, high = min(low, float(values.min())), max(high, float(values.max()))
    if not math.isfinite(low):
        raise DatasetError("an empty array has no value range.")
    for lo, hi in STANDARD_RANGES:
        if lo <= low and high <= hi:
            return ValueRange(lo, hi, "inferred")
    if low == high:  # a constant image: one grey, mid-range
        low, high = low - 0.5, high + 0.5
    return ValueRange(low, high, "inferred")
