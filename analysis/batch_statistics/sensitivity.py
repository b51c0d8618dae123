"""The sensitivity: CKA with each row layer's top principal direction of the whole sample removed.

With ``sensitivity=True`` each cell's CKA is recomputed with the row layer's top principal
direction *of the whole sample* removed
(:func:`analysis.estimators.spectrum.whole_sample_sensitivity`), which needs every layer's
features at once: the kept features (:mod:`analysis.batch_statistics.kept_features`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from analysis.batch_statistics.kept_features import FeatureStatistic, kept_layers
from analysis.batch_statistics.layer_spectra import TOP_SHARE
from analysis.batch_statistics.protocol import (
    Diagnose,
    Finishing,
    Options,
    Output,
    Setup,
    State,
    Switch,
    Tick,
)
from analysis.estimators.hsic import cka_from_hsic
from analysis.estimators.kernels import parse_kernel
from analysis.estimators.spectrum import whole_sample_sensitivity

__all__ = ["SensitivityFeatures"]


class SensitivityFeatures(FeatureStatistic):
    """The kept features (``layer.<k>``: (n, d)) and the samples of each kept batch (``sizes``)."""

    key: ClassVar[str] = "features"
    # CKA with the row layer's top direction removed, and the whole sample's top share
    outputs: ClassVar[tuple[Output, ...]] = (Output("cka_without_top_pc", "cells"), TOP_SHARE)
    switches: ClassVar[tuple[Switch, ...]] = ()

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return bool(options.sensitivity)

    @classmethod
    def start(cls, setup: Setup) -> SensitivityFeatures:
        return cls(setup)

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        features = kept_layers(state)
        sizes = [int(n) for n in np.asarray(state["sizes"])]
        config, hsic = done.config, done.hsic
        kern = parse_kernel(config["kernel"])
        cross, own, share = whole_sample_sensitivity(
            features, sizes, kern, config["estimator"], hsic
        )
        done.values["top_pc_share"] = share
        drop = cka_from_hsic(cross, own, np.diag(hsic))
        drop[~np.isfinite(done.cka)] = np.nan
        done.values["cka_without_top_pc"] = drop
        return None
