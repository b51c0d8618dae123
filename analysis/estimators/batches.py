"""The one loop over a comparison's batches: drop the small ones, take each batch's terms, sum.

Every minibatch path runs through :func:`sum_batches`: the atlas (:mod:`analysis.engine.streaming`,
with or without the Gram store), :func:`analysis.cka_from_features` and
:func:`analysis.cka_test`. A batch smaller than the estimator's minimum
(:data:`analysis.estimators.hsic.MIN_SAMPLES`), normally a ragged last one, is dropped and recorded;
every other batch gives its (L, L) float64 HSIC terms through ``step`` and counts with weight one
(Nguyen et al. 2021). A run over a whole plan that kept no batch has no CKA:
:meth:`BatchSums.require`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from analysis.errors import EstimatorError
from analysis.estimators.hsic import MIN_SAMPLES

__all__ = ["NO_BATCH", "BatchSums", "sum_batches"]

NO_BATCH = "no batch was large enough for the estimator; use more data"

T = TypeVar("T")


@dataclass
class BatchSums:
    """What the loop kept: the summed HSIC terms and the counts (what else a run keeps per
    batch, each batch's own terms included, is :mod:`analysis.batch_statistics`)."""

    hsic: np.ndarray | None = None
    n: int = 0  # samples in kept batches
    batches: int = 0  # kept batches
    seen: int = 0  # batches read, kept or dropped
    dropped: list[dict[str, int]] = field(default_factory=list)  # {"batch", "size"}

    def require(self) -> None:
        """Raise :class:`EstimatorError` if no batch was kept."""
        if not self.batches:
            raise EstimatorError(NO_BATCH)


def sum_batches(
    batches: Iterable[tuple[int, int, T]],
    estimator: str,
    step: Callable[[int, T], np.ndarray | None],
    *,
    after: Callable[[int], None] | None = None,
    sums: BatchSums | None = None,
) -> BatchSums:
    """Run ``step(index, batch)`` on every ``(index, size, batch)`` large enough for ``estimator``.

    ``step`` returns the batch's HSIC terms (added up), or None when it only collects (full
    mode keeps features). ``after(done)`` runs after every batch read, kept or not (progress,
    cancellation). Counters go to ``sums`` when given.
    """
    out = BatchSums() if sums is None else sums
    least = MIN_SAMPLES[estimator]
    for index, size, batch in batches:
        out.seen += 1
        if size < least:
            out.dropped.append({"batch": index, "size": size})
        else:
            h = step(index, batch)
            if h is not None:
                out.hsic = h.copy() if out.hsic is None else out.hsic + h
            out.n += size
            out.batches += 1
        if after is not None:
            after(out.seen)
    return out
