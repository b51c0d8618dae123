"""How much memory the whole-sample measures take, and how much they may.

They need every image's features of every selected layer at once (kept as the run computes
them, :mod:`analysis.batch_statistics.kept`), then each layer's factorisation
(:mod:`analysis.measures.factor`), held for all its pairs. :func:`estimate_bytes` adds those up
before the run keeps anything;
:meth:`analysis.CompareOptions.check_memory` refuses a run whose estimate passes
:func:`budget_bytes`, ``CKA_MEASURES_MEMORY_GB`` gibibytes (default
:data:`DEFAULT_BUDGET_GB`; a worker reads it from its environment).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from analysis.measures.mutual_knn import KNN_CHUNK
from analysis.measures.projected import PROJECTED, projector_forms, use_projectors

__all__ = ["BUDGET_ENV", "DEFAULT_BUDGET_GB", "budget_bytes", "estimate_bytes", "gib"]

BUDGET_ENV = "CKA_MEASURES_MEMORY_GB"
DEFAULT_BUDGET_GB = 8.0
_F64 = 8


def budget_bytes() -> int:
    """The memory the measures may take: ``CKA_MEASURES_MEMORY_GB`` GiB, else the default."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    try:
        gb = float(text) if text else DEFAULT_BUDGET_GB
    except ValueError:
        gb = DEFAULT_BUDGET_GB
    return int(gb * 2**30)


def gib(size: int) -> str:
    """``size`` bytes in GiB, as a sentence writes it."""
    return f"{size / 2**30:.2f} GiB"


def estimate_bytes(
    n: int, widths: Sequence[int], measures: Sequence[str], *, itemsize: int = 4, k: int = 10
) -> int:
    """Peak bytes of the whole-sample ``measures`` over ``n`` samples of layers of ``widths``
    features each (kept at ``itemsize`` bytes): the kept features, every layer's factorisation
    held at once (and its projectors, where the R² measures take that route), and the largest
    layer's float64 working set (its centred copy and SVD)."""
    wanted = set(measures)
    if not widths or not wanted - {"cka"}:
        return 0
    kept = n * sum(widths) * itemsize
    held, working = 0, 0
    factored = wanted & {"cca", "cca_mean", "svcca", "pwcca", "linreg", "procrustes"}
    for d in widths:
        r = min(n, d)
        if factored:
            held += (n * r + r) * _F64 + (r * d * _F64 if "pwcca" in wanted else 0)
            working = max(working, (2 * n * d + n * r + r * d) * _F64)
        if "mutual_knn" in wanted:
            held += n * k * _F64
            working = max(working, (2 * n * d + min(n, KNN_CHUNK) * n) * _F64)
    if use_projectors(n, len(widths), wanted & PROJECTED):
        held += projector_forms(wanted & PROJECTED) * len(widths) * n * n * _F64
    return kept + held + working
