"""The record of one range of a comparison's batch plan (a shard), and its file.

A :class:`Partial` (made in :mod:`analysis.shards.shard`) is saved as one safetensors file:
the summed HSIC as ``hsic``, each statistic's state (:mod:`analysis.batch_statistics`) as
``<key>.<name>`` arrays, everything else as JSON under the metadata key ``partial``. Never
pickle. A file of an earlier format is refused with a sentence that says so: its shard is run
again.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from analysis.batch_statistics.protocol import State
from analysis.errors import AnalysisError

__all__ = ["FORMAT", "Partial"]

FORMAT = "cka-atlas-partial/4"
_FAMILY = FORMAT.rpartition("/")[0] + "/"


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
    counters: dict[str, Any]  # StreamingRun.counters(), dropped batches by global index
    # each statistic's state by key (analysis.batch_statistics.registry); the sensitivity's
    # features are tensors on the GPU where a CUDA run kept them
    statistics: dict[str, State] = field(default_factory=dict)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write one safetensors file atomically (a temporary file renamed into place)."""
        arrays = {"hsic": self.hsic}
        for key, state in self.statistics.items():
            for name, value in state.items():
                arrays[f"{key}.{name}"] = _numpy(value)
        meta = {
            "format": FORMAT,
            "names": self.names,
            "selected": self.selected,
            "config": self.config,
            "start": self.start,
            "stop": self.stop,
            "total_batches": self.total_batches,
            "counters": self.counters,
            "statistics": {key: list(state) for key, state in self.statistics.items()},
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
        where = os.fspath(path)
        try:
            with safe_open(where, framework="np") as f:
                text = (f.metadata() or {}).get("partial")
                arrays: dict[str, np.ndarray] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            meta = json.loads(text) if text is not None else {}
        except (OSError, SafetensorError, json.JSONDecodeError) as exc:
            raise AnalysisError(f"{where} is not a readable partial: {exc}") from None
        found = meta.get("format") if isinstance(meta, dict) else None
        if isinstance(found, str) and found.startswith(_FAMILY) and found != FORMAT:
            raise AnalysisError(
                f"{where} is a shard of format {found}, written by an earlier version; this "
                f"version reads {FORMAT}: run that shard again"
            )
        if found != FORMAT or "hsic" not in arrays:
            raise AnalysisError(f"{where} is not a partial of format {FORMAT}")
        return cls(
            names=list(meta["names"]),
            selected={m: list(v) for m, v in meta["selected"].items()},
            config=meta["config"],
            start=int(meta["start"]),
            stop=int(meta["stop"]),
            total_batches=int(meta["total_batches"]),
            hsic=arrays["hsic"],
            counters=meta["counters"],
            statistics={
                key: {name: arrays[f"{key}.{name}"] for name in names}
                for key, names in meta["statistics"].items()
            },
        )


def _numpy(value: Any) -> np.ndarray:
    """A state's array on the host as numpy (a tensor may be on a GPU)."""
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
