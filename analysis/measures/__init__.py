"""Similarity measures other than CKA, on the same forward passes: the CCA family, linear
regression, orthogonal Procrustes and mutual k-NN (definitions and formulas: docs/measures.md).

Owns the measures' math and their memory estimate; imports torch and NumPy only (nothing else
of :mod:`analysis`, which calls it: a run keeps each layer's features over the whole sample and
:mod:`analysis.batch_statistics.measures` hands them to :func:`measure_matrices`). A measure is a
module here plus its row in :data:`MEASURES`.
"""

from __future__ import annotations

from typing import Literal, get_args

from analysis.measures.budget import budget_bytes, estimate_bytes
from analysis.measures.matrices import MeasureMatrices, measure_matrices

__all__ = [
    "DEFAULT_K",
    "MEASURES",
    "WHOLE_SAMPLE",
    "MeasureMatrices",
    "MeasureName",
    "budget_bytes",
    "estimate_bytes",
    "measure_matrices",
]

MeasureName = Literal[
    "cka", "cca", "cca_mean", "svcca", "pwcca", "linreg", "procrustes", "mutual_knn"
]
# Every measure by name, with the module that computes it. ``cka`` is the engine's own
# (streamed per batch, analysis.estimators.hsic); the others need every image's features at once.
MEASURES: dict[str, str] = {
    "cka": "analysis.estimators.hsic (streamed, per batch)",
    "cca": "analysis.measures.cca: mean squared canonical correlation R²_CCA",
    "cca_mean": "analysis.measures.cca: mean canonical correlation ρ̄",
    "svcca": "analysis.measures.cca: R²_CCA on the top directions with 99 % of the variance",
    "pwcca": "analysis.measures.cca: projection-weighted CCA, both directions' mean",
    "linreg": "analysis.measures.linreg: least-squares R², both directions' mean",
    "procrustes": "analysis.measures.procrustes: ‖XᵀY‖_* / (‖X‖_F ‖Y‖_F)",
    "mutual_knn": "analysis.measures.mutual_knn: shared share of k nearest neighbours",
}
assert tuple(MEASURES) == get_args(MeasureName)
WHOLE_SAMPLE = tuple(name for name in MEASURES if name != "cka")
# Neighbours per sample for mutual k-NN (Huh et al. 2024).
DEFAULT_K = 10
