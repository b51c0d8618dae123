"""The result of a comparison: accumulated HSIC for every layer pair, and CKA derived from it.

An :class:`Atlas` stores one symmetric float64 HSIC matrix over the layers of all models
(model by model, in ``models`` order); every CKA matrix is a block of the CKA computed from
it, so ``matrix(b, a)`` is exactly ``matrix(a, b).T`` and a model's block with itself is
included. ``to_dict`` gives plain JSON (``None`` where a value is undefined or not finite):

``hsic``, ``ci_low``, ``ci_high``
    the full (L_total, L_total) arrays (the intervals only with ``bootstrap``); the truth
    that :meth:`Atlas.from_dict` reads back.
``matrices``
    for every ordered model pair ``(a, b)`` with ``a`` at or before ``b`` in ``models``:
    ``{"a", "b", "cka", "ci_low", "ci_high"}``, rows the layers of ``a``; derived, for readers.
``self_hsic``
    per model, the diagonal of ``hsic`` for its layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.hsic import cka_from_hsic

__all__ = ["Atlas"]

FORMAT = "cka-atlas/1"


def _to_json(a: np.ndarray) -> list[Any]:
    return [[float(v) if np.isfinite(v) else None for v in row] for row in a]


def _from_json(rows: list[list[float | None]] | None) -> np.ndarray | None:
    if rows is None:
        return None
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


@dataclass(eq=False)
class Atlas:
    """CKA between every layer pair of every model pair, with its raw HSIC and provenance."""

    models: list[str]
    layers: dict[str, list[str]]
    hsic: np.ndarray
    n: int
    config: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.hsic = np.asarray(self.hsic, dtype=np.float64)
        self.cka = cka_from_hsic(self.hsic)
        self._offsets: dict[str, slice] = {}
        start = 0
        for name in self.models:
            self._offsets[name] = slice(start, start + len(self.layers[name]))
            start += len(self.layers[name])
        if self.hsic.shape != (start, start):
            raise ValueError(f"hsic has shape {self.hsic.shape}; the layers need {(start, start)}")

    def _block(self, full: np.ndarray, a: str, b: str) -> np.ndarray:
        for name in (a, b):
            if name not in self._offsets:
                raise KeyError(f"no model {name!r} in this atlas; it has {self.models}")
        return full[self._offsets[a], self._offsets[b]].copy()

    def matrix(self, a: str, b: str | None = None) -> np.ndarray:
        """CKA with rows the layers of ``a`` and columns those of ``b`` (default ``a``); NaN
        where undefined (see ``diagnostics["undefined_layers"]``)."""
        return self._block(self.cka, a, a if b is None else b)

    def hsic_block(self, a: str, b: str | None = None) -> np.ndarray:
        """The accumulated HSIC terms behind :meth:`matrix` (summed over batches)."""
        return self._block(self.hsic, a, a if b is None else b)

    def self_hsic(self, name: str) -> np.ndarray:
        """Accumulated HSIC(K, K) of each layer of model ``name``."""
        return np.diag(self.hsic_block(name)).copy()

    def interval(self, a: str, b: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The bootstrap 95 % percentile interval (low, high) per cell, or None without one."""
        if self.ci_low is None or self.ci_high is None:
            return None
        b = a if b is None else b
        return self._block(self.ci_low, a, b), self._block(self.ci_high, a, b)

    def pairs(self) -> list[tuple[str, str]]:
        """Every model pair (a, b) with a at or before b, the order ``to_dict`` uses."""
        return [(a, b) for i, a in enumerate(self.models) for b in self.models[i:]]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; :meth:`from_dict` restores an equal atlas."""
        matrices = []
        for a, b in self.pairs():
            ci = self.interval(a, b)
            matrices.append(
                {
                    "a": a,
                    "b": b,
                    "cka": _to_json(self.matrix(a, b)),
                    "ci_low": None if ci is None else _to_json(ci[0]),
                    "ci_high": None if ci is None else _to_json(ci[1]),
                }
            )
        return {
            "format": FORMAT,
            "models": list(self.models),
            "layers": {m: list(self.layers[m]) for m in self.models},
            "n": int(self.n),
            "config": self.config,
            "hsic": _to_json(self.hsic),
            "ci_low": None if self.ci_low is None else _to_json(self.ci_low),
            "ci_high": None if self.ci_high is None else _to_json(self.ci_high),
            "self_hsic": {m: _to_json(self.self_hsic(m)[None])[0] for m in self.models},
            "matrices": matrices,
            "diagnostics": self.diagnostics,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Atlas:
        """Rebuild an atlas from :meth:`to_dict` output (or its JSON, parsed)."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} atlas (format {data.get('format')!r})")
        hsic = _from_json(data["hsic"])
        assert hsic is not None
        return cls(
            models=list(data["models"]),
            layers={m: list(v) for m, v in data["layers"].items()},
            hsic=hsic.reshape(sum(len(v) for v in data["layers"].values()), -1),
            n=int(data["n"]),
            config=dict(data["config"]),
            diagnostics=dict(data["diagnostics"]),
            ci_low=_from_json(data.get("ci_low")),
            ci_high=_from_json(data.get("ci_high")),
        )
