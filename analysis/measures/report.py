"""What an atlas's diagnostics say about its whole-sample measures and their flags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.measures.matrices import MeasureMatrices
from analysis.measures.registry import FLAGS

__all__ = ["flag_count", "flag_warnings", "measures_diagnostics"]


def _cells(owners: Sequence[tuple[str, str]], flagged: np.ndarray) -> list[dict[str, str]]:
    """``{"a", "layer_a", "b", "layer_b"}`` per flagged cell of the upper triangle."""
    cells = []
    for i, j in zip(*flagged.nonzero(), strict=True):
        if i <= j:
            (a, la), (b, lb) = owners[i], owners[j]
            cells.append({"a": a, "layer_a": la, "b": b, "layer_b": lb})
    return cells


def measures_diagnostics(
    owners: Sequence[tuple[str, str]], found: MeasureMatrices
) -> dict[str, Any]:
    """``diagnostics["measures"]``: the measures computed, each layer's centred rank (by model,
    in layer order; ``owners`` names each row's model and layer), the CCA-degenerate cells
    (``cca_degenerate``) and per flag of the measures computed its cells (``flags``)."""
    ranks: dict[str, list[int]] = {}
    for (model, _), rank in zip(owners, found.ranks or [], strict=False):
        ranks.setdefault(model, []).append(rank)
    degenerate = found.degenerate
    return {
        "computed": list(found.values),
        "ranks": ranks if found.ranks is not None else None,
        "cca_degenerate": [] if degenerate is None else _cells(owners, degenerate),
        "flags": {name: _cells(owners, flagged) for name, flagged in found.flags.items()},
    }


def flag_count(flagged: np.ndarray) -> int:
    """How many cells of a symmetric (L, L) flag matrix are flagged, each layer pair once."""
    return int(flagged.sum() + flagged.diagonal().sum()) // 2


def flag_warnings(flags: dict[str, np.ndarray]) -> list[str]:
    """One sentence per flag raised somewhere (:meth:`analysis.measures.Flag.sentence`), in the
    registry's order."""
    return [
        flag.sentence(flag_count(flags[flag.name]))
        for flag in FLAGS
        if flag.name in flags and flags[flag.name].any()
    ]
