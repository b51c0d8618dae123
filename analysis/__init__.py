"""Activation extraction, kernels, HSIC estimators and the streaming CKA atlas.

A plain library: no web, no database; import it from a notebook.
"""

from __future__ import annotations

from analysis.datasets import ImageDataset, load_dataset
from analysis.errors import AnalysisError, Cancelled, DatasetError, EstimatorError, LayerError

__all__ = [
    "AnalysisError",
    "Cancelled",
    "DatasetError",
    "EstimatorError",
    "ImageDataset",
    "LayerError",
    "load_dataset",
]
