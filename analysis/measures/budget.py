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
from collections.abc import Callable, Sequence

from analysis.measures.mutual_knn import KNN_CHUNK
from analysis.measures.projected import use_projectors
from analysis.measures.protocol import Need
from analysis.measures.registry import measure

__all__ = ["BUDGET_ENV", "DEFAULT_BUDGET_GB", "NEED_BYTES", "budget_bytes", "estimate_bytes", "gib"]

BUDGET_ENV = "CKA_MEASURES_MEMORY_GB"
DEFAULT_BUDGET_GB = 8.0
_F64 = 8


def _factor(n: int, d: int, k: int) -> tuple[int, int]:
    """A layer's factorisation: its basis and singular values held; its centred float64
    copy, that basis and the right factor while it is made."""
    r = min(n, d)
    return (n * r + r) * _F64, (2 * n * d + n * r + r * d) * _F64


def _loadings(n: int, d: int, k: int) -> tuple[int, int]:
    """The loadings Qᵀ X (r × d) held beside the factorisation."""
    return min(n, d) * d * _F64, 0


def _neighbours(n: int, d: int, k: int) -> tuple[int, int]:
    """Each sample's k neighbours held; the centred copy and a chunk of similarities meanwhile."""
    return n * k * _F64, (2 * n * d + min(n, KNN_CHUNK) * n) * _F64


# Per need of a measure (analysis.measures.protocol.Need): the bytes one layer of d features
# over n samples holds for all its pairs, and its working set while it is prepared.
NEED_BYTES: dict[Need, Callable[[int, int, int], tuple[int, int]]] = {
    "factor": _factor,
    "loadings": _loadings,
    "neighbours": _neighbours,
}


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
    features each (kept at ``itemsize`` bytes): the kept features, what every layer holds for
    the needs of the measures (:data:`NEED_BYTES`, each need once) and their projectors, where
    the measures with that route take it, and the largest working set of one layer's
    preparation (its centred float64 copy and SVD)."""
    wanted = [measure(m) for m in dict.fromkeys(measures) if m != "cka"]
    if not widths or not wanted:
        return 0
    kept = n * sum(widths) * itemsize
    needs = [need for need in NEED_BYTES if any(need in m.needs for m in wanted)]
    held, working = 0, 0
    for d in widths:
        for need in needs:
            h, w = NEED_BYTES[need](n, d, k)
            held += h
            working = max(working, w)
    forms = len({form for m in wanted if m.projected is not None for form in m.projectors})
    if use_projectors(n, len(widths), forms):
        held += forms * len(widths) * n * n * _F64
    return kept + held + working
