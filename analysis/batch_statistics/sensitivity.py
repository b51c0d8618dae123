"""The sensitivity: CKA with each row layer's top principal direction of the whole sample removed.

With ``sensitivity=True`` each cell's CKA is recomputed with the row layer's top principal
direction *of the whole sample* removed
(:func:`analysis.estimators.spectrum.whole_sample_sensitivity`), which needs every layer's
features at once: the kept features (:mod:`analysis.batch_statistics.kept_features`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from analysis.atlas import Atlas
from analysis.batch_statistics.kept_features import FeatureStatistic, kept_layers
from analysis.batch_statistics.protocol import Diagnose, Setup, State, Tick
from analysis.estimators.hsic import cka_from_hsic
from analysis.estimators.spectrum import whole_sample_sensitivity
from analysis.options import CompareOptions

__all__ = ["SensitivityFeatures"]


class SensitivityFeatures(FeatureStatistic):
    """The kept features (``layer.<k>``: (n, d)) and the samples of each kept batch (``sizes``)."""

    key: ClassVar[str] = "features"

    @classmethod
    def wanted(cls, options: CompareOptions) -> bool:
        return bool(options.sensitivity)

    @classmethod
    def start(cls, setup: Setup) -> SensitivityFeatures:
        return cls(setup)

    @classmethod
    def finish(cls, atlas: Atlas, state: State, batches: int, tick: Tick) -> Diagnose | None:
        features = kept_layers(state)
        sizes = [int(n) for n in np.asarray(state["sizes"])]
        config, hsic = atlas.config, atlas.hsic
        kern = CompareOptions.build(kernel=config["kernel"]).parsed_kernel
        cross, own, share = whole_sample_sensitivity(
            features, sizes, kern, config["estimator"], hsic
        )
        atlas.layer_top_share = share
        drop = cka_from_hsic(cross, own, np.diag(hsic))
        drop[~np.isfinite(atlas.cka)] = np.nan
        atlas.cka_drop = drop
        return None
