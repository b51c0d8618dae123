"""Activation extraction, kernels, HSIC estimators and the streaming CKA atlas.

A plain library: no web, no database; import it from a notebook.
"""

from __future__ import annotations

from analysis.atlas import Atlas
from analysis.datasets import ImageDataset, load_dataset
from analysis.engine import cka_from_features, compare
from analysis.errors import AnalysisError, Cancelled, DatasetError, EstimatorError, LayerError
from analysis.gram_cache import DirectoryGramCache, GramCache
from analysis.layers import default_layers, resolve_layers
from analysis.options import CompareOptions, OptionsError, option_specs

__all__ = [
    "AnalysisError",
    "Atlas",
    "Cancelled",
    "CompareOptions",
    "DatasetError",
    "DirectoryGramCache",
    "EstimatorError",
    "GramCache",
    "ImageDataset",
    "LayerError",
    "OptionsError",
    "cka_from_features",
    "compare",
    "default_layers",
    "load_dataset",
    "option_specs",
    "resolve_layers",
]
