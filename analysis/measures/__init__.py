"""Similarity measures other than CKA, on the same forward passes: the CCA family, linear
regression, orthogonal Procrustes and mutual k-NN (definitions and formulas: docs/measures.md).

Owns the measures' math, their flags and their memory estimate; imports torch, NumPy and
:mod:`analysis.errors` only (nothing else of :mod:`analysis`, which calls it: a run keeps each
layer's features over the whole sample and :mod:`analysis.batch_statistics.measures` hands them
to :func:`measure_matrices`). A measure is a module here declaring a
:class:`~analysis.measures.protocol.Measure` (its name, title, needs, value per pair and flags)
plus its line in :data:`analysis.measures.registry.REGISTERED`; everything else (the options,
the budget, the atlas, the heatmaps, the exports) reads the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from analysis.measures.budget import budget_bytes, estimate_bytes
from analysis.measures.matrices import MeasureMatrices, measure_matrices
from analysis.measures.protocol import Flag, Measure
from analysis.measures.registry import FLAGS, REGISTERED, flags_of, measure

__all__ = [
    "DEFAULT_K",
    "FLAGS",
    "MEASURES",
    "REGISTERED",
    "TITLES",
    "WHOLE_SAMPLE",
    "Flag",
    "Measure",
    "MeasureMatrices",
    "MeasureName",
    "budget_bytes",
    "estimate_bytes",
    "flags_of",
    "measure",
    "measure_matrices",
]

# Every measure by name, with the module that computes it. ``cka`` is the engine's own
# (streamed per batch, analysis.estimators.hsic); the others need every image's features at once.
MEASURES: dict[str, str] = {m.name: m.summary for m in REGISTERED}
# How a heatmap, the page and a table name each measure.
TITLES: dict[str, str] = {m.name: m.title for m in REGISTERED}
if TYPE_CHECKING:
    MeasureName = str
else:  # the registered names, as the options' schema offers them
    MeasureName = Literal[tuple(MEASURES)]
WHOLE_SAMPLE = tuple(m.name for m in REGISTERED if not m.streamed)
# Neighbours per sample for mutual k-NN (Huh et al. 2024).
DEFAULT_K = 10
