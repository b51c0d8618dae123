"""What an atlas's diagnostics say about its whole-sample measures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.measures.matrices import MeasureMatrices

__all__ = ["degenerate_warning", "measures_diagnostics"]


def measures_diagnostics(
    owners: Sequence[tuple[str, str]], found: MeasureMatrices
) -> dict[str, Any]:
    """``diagnostics["measures"]``: the measures computed, each layer's centred rank (by model,
    in layer order; ``owners`` names each row's model and layer) and the CCA-degenerate cells:
    ``{"a", "layer_a", "b", "layer_b"}`` per cell of the upper triangle."""
    ranks: dict[str, list[int]] = {}
    for (model, _), rank in zip(owners, found.ranks or [], strict=False):
        ranks.setdefault(model, []).append(rank)
    cells = []
    if found.degenerate is not None:
        for i, j in zip(*found.degenerate.nonzero(), strict=True):
            if i <= j:
                (a, la), (b, lb) = owners[i], owners[j]
                cells.append({"a": a, "layer_a": la, "b": b, "layer_b": lb})
    return {
        "computed": list(found.values),
        "ranks": ranks if found.ranks is not None else None,
        "cca_degenerate": cells,
    }


def degenerate_warning(found: MeasureMatrices) -> list[str]:
    """One sentence when some cell's CCA is degenerate, else none."""
    if found.degenerate is None or not found.degenerate.any():
        return []
    count = int(found.degenerate.sum() + found.degenerate.diagonal().sum()) // 2
    return [
        f"CCA is degenerate in {count} cells: their layers' ranks add up past n − 1, so some "
        "canonical correlations are 1 whatever the data (all of them where a layer is as wide "
        "as the sample); use more images than features (docs/measures.md)"
    ]
