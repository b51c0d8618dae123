"""The whole-sample measures beside CKA (CCA family, linear regression, Procrustes, mutual k-NN).

They need every layer's features over the whole sample at once: the kept features
(:mod:`analysis.batch_statistics.kept_features`, shared with the sensitivity when both are
asked for), whose memory the engine checks against the budget before it keeps them
(:meth:`analysis.options.CompareOptions.check_memory`). The finish computes every measure's
matrix (:func:`analysis.measures.measure_matrices`) into :attr:`analysis.Atlas.measures`, the
CCA-degenerate cells into :attr:`analysis.Atlas.cca_flags`, and says which cells those are in
``diagnostics["measures"]`` with one warning. A run with CKA alone does not start it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from analysis.atlas import Atlas
from analysis.batch_statistics.kept_features import FeatureStatistic, kept_layers
from analysis.batch_statistics.protocol import Diagnose, Setup, State, Tick
from analysis.measures import DEFAULT_K, measure_matrices
from analysis.measures.report import degenerate_warning, measures_diagnostics
from analysis.options import CompareOptions

__all__ = ["WholeSampleMeasures"]


class WholeSampleMeasures(FeatureStatistic):
    """The kept features (``layer.<k>``: (n, d)) and the samples of each kept batch (``sizes``)."""

    key: ClassVar[str] = "measures"

    @classmethod
    def wanted(cls, options: CompareOptions) -> bool:
        return bool(options.whole_sample)

    @classmethod
    def start(cls, setup: Setup) -> WholeSampleMeasures:
        return cls(setup)

    @classmethod
    def finish(cls, atlas: Atlas, state: State, batches: int, tick: Tick) -> Diagnose | None:
        config = atlas.config
        wanted = [m for m in config.get("measures") or () if m != "cka"]
        found = measure_matrices(
            kept_layers(state), wanted, k=int(config.get("knn_k") or DEFAULT_K), tick=tick
        )
        atlas.measures, atlas.cca_flags = found.values, found.degenerate
        owners = [(m, layer) for m in atlas.models for layer in atlas.layers[m]]

        def diagnose(done: Atlas) -> dict[str, Any]:
            return {
                "measures": measures_diagnostics(owners, found),
                "warnings": [*done.warnings, *degenerate_warning(found)],
            }

        return diagnose
