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

Inside, the parts stand in one order, each importing only those before it (imports inside
functions and under ``TYPE_CHECKING`` included; ``tests/test_layers.py`` holds it):

1. :mod:`analysis.errors` and :mod:`analysis._lazy` (import nothing of the library);
2. :mod:`analysis.estimators`: kernels, HSIC, CKA, spectra, the one loop over batches;
3. :mod:`analysis.measures`: the whole-sample measures beside CKA;
4. :mod:`analysis.data`: datasets, archives, input pipelines, batch sources;
5. :mod:`analysis.layers`: which layers of a network to read, and reading them;
6. :mod:`analysis.inference`: nulls, intervals, q-values and verdicts, as math;
7. :mod:`analysis.batch_statistics`: what a run accumulates per batch, each statistic declaring
   its outputs and options;
8. :mod:`analysis.options`: every option of a comparison (the statistics' among them);
9. :mod:`analysis.atlas`: the result (the statistics' outputs as they declare them);
10. :mod:`analysis.engine`: the work of each batch, the Gram store, CKA of given features;
11. :mod:`analysis.shards`: a run over a range of batches, and their combine;
12. :mod:`analysis.comparison`: the plan and its run, the baselines;
13. :mod:`analysis.plot`: heatmaps;
14. :mod:`analysis.studies`: studies of many trainings and one atlas;

and this package's face, above them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis import errors
from analysis._lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers; at run time __getattr__ imports them
    from analysis.atlas import Atlas
    from analysis.comparison.baselines import random_init_twin
    from analysis.comparison.memory import comparison_bytes, describe_bytes
    from analysis.comparison.plan import (
        ComparisonPlan,
        Member,
        Networks,
        members_of,
        plan_comparison,
    )
    from analysis.comparison.run import (
        GivenNetworks,
        Hooks,
        add_baselines,
        compare,
        compare_partial,
        run_comparison,
        run_shard,
    )
    from analysis.comparison.seed_ceiling import Identity
    from analysis.data.datasets import (
        DatasetInfo,
        ImageDataset,
        describe_dataset,
        load_dataset,
        training_data,
    )
    from analysis.data.decoded import DecodedCache, DirectoryDecodedCache
    from analysis.engine.features import cka_from_features
    from analysis.engine.gram_cache import DirectoryGramCache, GramCache
    from analysis.engine.significance import CKATest, cka_test
    from analysis.engine.streaming import RunSettings
    from analysis.errors import (
        AnalysisError,
        Cancelled,
        DatasetError,
        DatasetTooLarge,
        EstimatorError,
        LayerError,
        OptionsError,
    )
    from analysis.layers import (
        FEATURE_POLICIES,
        FeaturePolicy,
        LayerReader,
        check_feature,
        default_layers,
        resolve_layers,
    )
    from analysis.options import CompareOptions, option_specs
    from analysis.shards.shard import Partial, batch_count, combine, shard_ranges

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        ".atlas": ["Atlas"],
        ".comparison.baselines": ["random_init_twin"],
        ".comparison.memory": ["comparison_bytes", "describe_bytes"],
        ".comparison.plan": [
            "ComparisonPlan",
            "Member",
            "Networks",
            "members_of",
            "plan_comparison",
        ],
        ".comparison.run": [
            "GivenNetworks",
            "Hooks",
            "add_baselines",
            "compare",
            "compare_partial",
            "run_comparison",
            "run_shard",
        ],
        ".comparison.seed_ceiling": ["Identity"],
        ".data.decoded": ["DecodedCache", "DirectoryDecodedCache"],
        ".data.datasets": [
            "DatasetInfo",
            "ImageDataset",
            "describe_dataset",
            "load_dataset",
            "training_data",
        ],
        ".engine.features": ["cka_from_features"],
        ".engine.gram_cache": ["DirectoryGramCache", "GramCache"],
        ".engine.streaming": ["RunSettings"],
        ".errors": errors.__all__,  # a module that imports nothing
        ".engine.significance": ["CKATest", "cka_test"],
        ".layers": [
            "FEATURE_POLICIES",
            "FeaturePolicy",
            "LayerReader",
            "check_feature",
            "default_layers",
            "resolve_layers",
        ],
        ".options": ["CompareOptions", "option_specs"],
        ".shards.shard": ["Partial", "batch_count", "combine", "shard_ranges"],
    },
)

__all__ = [
    "FEATURE_POLICIES",
    "AnalysisError",
    "Atlas",
    "CKATest",
    "Cancelled",
    "CompareOptions",
    "ComparisonPlan",
    "DatasetError",
    "DatasetInfo",
    "DatasetTooLarge",
    "DecodedCache",
    "DirectoryDecodedCache",
    "DirectoryGramCache",
    "EstimatorError",
    "FeaturePolicy",
    "GivenNetworks",
    "GramCache",
    "Hooks",
    "Identity",
    "ImageDataset",
    "LayerError",
    "LayerReader",
    "Member",
    "Networks",
    "OptionsError",
    "Partial",
    "RunSettings",
    "add_baselines",
    "batch_count",
    "check_feature",
    "cka_from_features",
    "cka_test",
    "combine",
    "compare",
    "compare_partial",
    "comparison_bytes",
    "default_layers",
    "describe_bytes",
    "describe_dataset",
    "load_dataset",
    "members_of",
    "option_specs",
    "plan_comparison",
    "random_init_twin",
    "resolve_layers",
    "run_comparison",
    "run_shard",
    "shard_ranges",
    "training_data",
]
