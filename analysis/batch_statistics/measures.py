"""The whole-sample measures beside CKA (CCA family, linear regression, Procrustes, mutual k-NN).

They need every layer's features over the whole sample at once: the kept features
(:mod:`analysis.batch_statistics.kept_features`, shared with the sensitivity when both are
asked for), whose memory the engine checks against the budget before it keeps them
(:meth:`analysis.options.CompareOptions.check_memory`). The finish computes every measure's
matrix (:func:`analysis.measures.measure_matrices`) into :attr:`analysis.Atlas.measures`, each
flag the computed measures declare (:data:`analysis.measures.FLAGS`: the CCA-degenerate cells,
saturated linear regression or Procrustes, too few images for mutual k-NN's k) as an output of
its own, and says which cells those are in ``diagnostics["measures"]`` with one warning per flag
raised. A run with CKA alone does not start it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from analysis.batch_statistics.kept_features import FeatureStatistic, kept_layers
from analysis.batch_statistics.protocol import (
    AtlasView,
    Diagnose,
    Finishing,
    Options,
    Output,
    Setup,
    State,
    Switch,
    Tick,
)
from analysis.measures import DEFAULT_K, FLAGS, measure_matrices
from analysis.measures.report import flag_warnings, measures_diagnostics

__all__ = ["WholeSampleMeasures"]


class WholeSampleMeasures(FeatureStatistic):
    """The kept features (``layer.<k>``: (n, d)) and the samples of each kept batch (``sizes``)."""

    key: ClassVar[str] = "measures"
    # per measure its (L, L) matrix (the atlas's "measures/<name>"); per flag the measures
    # declare (analysis.measures.registry), per cell whether it is raised there
    outputs: ClassVar[tuple[Output, ...]] = (
        Output("measures", "cells", blocks=True, grouped=True),
        *(Output(flag.name, "flags") for flag in FLAGS),
    )
    switches: ClassVar[tuple[Switch, ...]] = ()

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return bool(options.whole_sample)

    @classmethod
    def start(cls, setup: Setup) -> WholeSampleMeasures:
        return cls(setup)

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        config = done.config
        wanted = [m for m in config.get("measures") or () if m != "cka"]
        found = measure_matrices(
            kept_layers(state), wanted, k=int(config.get("knn_k") or DEFAULT_K), tick=tick
        )
        done.values |= {f"measures/{name}": full for name, full in found.values.items()}
        done.values |= found.flags

        def diagnose(atlas: AtlasView) -> dict[str, Any]:
            owners = [(m, layer) for m in atlas.models for layer in atlas.layers[m]]
            return {
                "measures": measures_diagnostics(owners, found),
                "warnings": [*atlas.warnings, *flag_warnings(found.flags)],
            }

        return diagnose
