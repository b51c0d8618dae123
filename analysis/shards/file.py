"""The record of one range of a comparison's batch plan, and its file (see
:mod:`analysis.shards.shard`).

A :class:`Partial` is saved as one safetensors file: its arrays under their names (the spectra
as ``spectra.<key>``), everything else as JSON under the metadata key ``partial``. Never pickle.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from analysis.errors import AnalysisError
from analysis.inference.image_intervals import MOMENTS

__all__ = ["FORMAT", "SPECTRA", "Partial"]

FORMAT = "cka-atlas-partial/3"
SPECTRA = ("pr", "share", "batches")


@dataclass(eq=False)
class Partial:
    """The summed terms of one range [start, stop) of a comparison's batch plan."""

    names: list[str]
    selected: dict[str, list[str]]
    config: dict[str, Any]  # what compare() puts in atlas.config, dataset included
    start: int
    stop: int
    total_batches: int
    hsic: np.ndarray  # (L, L): summed over the range's kept batches
    per_batch: np.ndarray | None  # (kept batches, L, L) in batch order, with bootstrap
    null: np.ndarray | None  # (P, L, L) summed null HSIC, with permutations
    spectra: dict[str, np.ndarray] | None  # SpectrumAccumulator.state()
    counters: dict[str, Any]  # StreamingRun.counters(), dropped batches by global index
    # the analytic null's AnalyticNull.state(): summed cumulants, and any kept Grams
    null_moments: dict[str, np.ndarray] | None = None
    moments: dict[str, np.ndarray] | None = None  # ImageMoments.state(), image-level intervals
    # per layer (n, d), kept batches, with sensitivity; on the GPU where a CUDA run kept them
    features: list[torch.Tensor] | None = None
    sizes: np.ndarray | None = None  # samples of each kept batch, in order, with sensitivity

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write one safetensors file atomically (a temporary file renamed into place)."""
        arrays = {"hsic": self.hsic}
        if self.per_batch is not None:
            arrays["per_batch"] = self.per_batch
        if self.null is not None:
            arrays["null"] = self.null
        for key, value in (self.null_moments or {}).items():
            arrays[f"analytic.{key}"] = value
        for key, value in (self.spectra or {}).items():
            arrays[f"spectra.{key}"] = value
        for key, value in (self.moments or {}).items():
            arrays[f"moments.{key}"] = value
        for k, kept in enumerate(self.features or []):
            arrays[f"features.{k}"] = kept.cpu().numpy()
        if self.sizes is not None:
            arrays["sizes"] = self.sizes
        meta = {
            "format": FORMAT,
            "names": self.names,
            "selected": self.selected,
            "config": self.config,
            "start": self.start,
            "stop": self.stop,
            "total_batches": self.total_batches,
            "counters": self.counters,
            "spectra": self.spectra is not None,
            "moments": self.moments is not None,
            "analytic": self.null_moments is not None,
            "features": None if self.features is None else len(self.features),
        }
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            contiguous = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # 0-d stays 0-d
            save_file(contiguous, tmp, metadata={"partial": json.dumps(meta, allow_nan=False)})
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Partial:
        """Read a file written by :meth:`save`; anything else is an :class:`AnalysisError`."""
        try:
            with safe_open(os.fspath(path), framework="np") as f:
                text = (f.metadata() or {}).get("partial")
                arrays: dict[str, np.ndarray] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            meta = json.loads(text) if text is not None else {}
        except (OSError, SafetensorError, json.JSONDecodeError) as exc:
            raise AnalysisError(f"{os.fspath(path)} is not a readable partial: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or "hsic" not in arrays:
            raise AnalysisError(f"{os.fspath(path)} is not a partial of format {FORMAT}")
        spectra = {k: arrays[f"spectra.{k}"] for k in SPECTRA} if meta["spectra"] else None
        return cls(
            names=list(meta["names"]),
            selected={m: list(v) for m, v in meta["selected"].items()},
            config=meta["config"],
            start=int(meta["start"]),
            stop=int(meta["stop"]),
            total_batches=int(meta["total_batches"]),
            hsic=arrays["hsic"],
            per_batch=arrays.get("per_batch"),
            null=arrays.get("null"),
            spectra=spectra,
            counters=meta["counters"],
            null_moments={k[9:]: v for k, v in arrays.items() if k.startswith("analytic.")}
            if meta["analytic"]
            else None,
            moments={k: arrays[f"moments.{k}"] for k in MOMENTS} if meta["moments"] else None,
            features=None
            if meta["features"] is None
            else [torch.from_numpy(arrays[f"features.{k}"]) for k in range(int(meta["features"]))],
            sizes=arrays.get("sizes"),
        )
