"""Activation extraction, kernels, HSIC estimators and the streaming CKA atlas.

A plain library: no web, no database; import it from a notebook. It owns the data side of a
comparison — datasets and preprocessing, layer extraction, kernels and HSIC estimators, the
streaming engine, calibration and study statistics — and sits above :mod:`models`: it may
import :mod:`models` (to build, load and describe networks), never :mod:`app`, and
:mod:`models` never imports it back. A notebook trains and compares with both::

    digits = analysis.training_data("digits")            # digits' fixed (train, test) splits
    paths = [models.train("mlp_digits", digits, seed=s, epochs=1) for s in (0, 1)]
    atlas = analysis.compare({f"s{i}": models.load(p)[0] for i, p in enumerate(paths)},
                             analysis.load_dataset("digits"))
    atlas.matrix("s0", "s1")

The names below are loaded on first use (:mod:`analysis._lazy`): ``import analysis`` and the
light submodules a service names at start-up (:mod:`analysis.options`, :mod:`analysis.errors`)
import neither :mod:`models` (with timm) nor matplotlib; ``analysis.compare`` and the rest
import their modules when first read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis import errors
from analysis._lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers; at run time __getattr__ imports them
    from analysis.atlas import Atlas
    from analysis.data.datasets import (
        DatasetInfo,
        ImageDataset,
        describe_dataset,
        load_dataset,
        training_data,
    )
    from analysis.engine.compare import add_baselines, cka_from_features, compare
    from analysis.engine.gram_cache import DirectoryGramCache, GramCache
    from analysis.engine.layers import default_layers, resolve_layers
    from analysis.errors import (
        AnalysisError,
        Cancelled,
        DatasetError,
        DatasetTooLarge,
        EstimatorError,
        LayerError,
    )
    from analysis.inference.baselines import random_init_twin
    from analysis.inference.significance import CKATest, cka_test
    from analysis.options import CompareOptions, OptionsError, option_specs
    from analysis.shards.shard import (
        Partial,
        batch_count,
        combine,
        compare_partial,
        shard_ranges,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".atlas": ["Atlas"],
        ".data.datasets": [
            "DatasetInfo",
            "ImageDataset",
            "describe_dataset",
            "load_dataset",
            "training_data",
        ],
        ".engine.compare": ["add_baselines", "cka_from_features", "compare"],
        ".engine.gram_cache": ["DirectoryGramCache", "GramCache"],
        ".engine.layers": ["default_layers", "resolve_layers"],
        ".errors": errors.__all__,  # a module that imports nothing
        ".inference.baselines": ["random_init_twin"],
        ".inference.significance": ["CKATest", "cka_test"],
        ".options": ["CompareOptions", "OptionsError", "option_specs"],
        ".shards.shard": ["Partial", "batch_count", "combine", "compare_partial", "shard_ranges"],
    },
)

__all__ = [
    "AnalysisError",
    "Atlas",
    "CKATest",
    "Cancelled",
    "CompareOptions",
    "DatasetError",
    "DatasetInfo",
    "DatasetTooLarge",
    "DirectoryGramCache",
    "EstimatorError",
    "GramCache",
    "ImageDataset",
    "LayerError",
    "OptionsError",
    "Partial",
    "add_baselines",
    "batch_count",
    "cka_from_features",
    "cka_test",
    "combine",
    "compare",
    "compare_partial",
    "default_layers",
    "describe_dataset",
    "load_dataset",
    "option_specs",
    "random_init_twin",
    "resolve_layers",
    "shard_ranges",
    "training_data",
]
