"""Every statistic a run may accumulate, in the order :func:`analysis.combine` finishes them.

Registering a statistic is adding its class here; its ``key`` must be new (it names the
statistic's arrays in a shard's file). The order matters only where one finish reads what
another wrote: the spectra's batch-average top share before the sensitivity's whole-sample one,
and every field of the atlas before the diagnostics that read it.
"""

from __future__ import annotations

from analysis.batch_statistics.analytic_null import AnalyticNullSums
from analysis.batch_statistics.bootstrap_terms import BootstrapTerms
from analysis.batch_statistics.image_moments import ImageIntervalMoments
from analysis.batch_statistics.layer_spectra import LayerSpectra
from analysis.batch_statistics.measures import WholeSampleMeasures
from analysis.batch_statistics.permutation_null import DrawnNull
from analysis.batch_statistics.protocol import BatchStatistic, Setup
from analysis.batch_statistics.sensitivity import SensitivityFeatures
from analysis.errors import AnalysisError

__all__ = ["STATISTICS", "start_wanted", "statistic"]

STATISTICS: tuple[type[BatchStatistic], ...] = (
    BootstrapTerms,
    ImageIntervalMoments,
    DrawnNull,
    LayerSpectra,
    SensitivityFeatures,
    WholeSampleMeasures,
    AnalyticNullSums,
)


def statistic(key: str) -> type[BatchStatistic]:
    """The registered statistic named ``key``."""
    for cls in STATISTICS:
        if cls.key == key:
            return cls
    raise AnalysisError(f"no statistic {key!r}; known: {', '.join(c.key for c in STATISTICS)}")


def start_wanted(setup: Setup) -> dict[str, BatchStatistic]:
    """A fresh accumulator, by key, of every statistic a run with ``setup.options`` keeps."""
    return {cls.key: cls.start(setup) for cls in STATISTICS if cls.wanted(setup.options)}
