"""Activation extraction, kernels, HSIC estimators and the streaming CKA atlas.

A plain library: no web, no database; import it from a notebook.
"""

from __future__ import annotations

from analysis.atlas import Atlas
from analysis.baselines import random_init_twin
from analysis.datasets import ImageDataset, load_dataset
from analysis.engine import cka_from_features, compare
from analysis.errors import AnalysisError, Cancelled, DatasetError, EstimatorError, LayerError
from analysis.gram_cache import DirectoryGramCache, GramCache
from analysis.layers import default_layers, resolve_layers
from analysis.options import CompareOptions, OptionsError, option_specs
from analysis.partial import Partial, batch_count, combine, compare_partial, shard_ranges
from analysis.significance import CKATest, cka_test

__all__ = [
    "AnalysisError",
    "Atlas",
    "CKATest",
    "Cancelled",
    "CompareOptions",
    "DatasetError",
    "DirectoryGramCache",
    "EstimatorError",
    "GramCache",
    "ImageDataset",
    "LayerError",
    "OptionsError",
    "Partial",
    "batch_count",
    "cka_from_features",
    "cka_test",
    "combine",
    "compare",
    "compare_partial",
    "default_layers",
    "load_dataset",
    "option_specs",
    "random_init_twin",
    "resolve_layers",
    "shard_ranges",
]
