"""Every statistic a run may accumulate, in the order :func:`analysis.combine` finishes them.

Registering a statistic is adding its class here; its ``key`` must be new (it names the
statistic's arrays in a shard's file). The order matters only where one finish reads what
another wrote: the spectra's batch-average top share before the sensitivity's whole-sample one,
and every field of the atlas before the diagnostics that read it. What the rest of the library
derives from the registered statistics is here too: :data:`OUTPUTS`, every array an atlas may
carry (:class:`analysis.Atlas` reads and writes them by these declarations), and
:data:`SWITCHES`, the options they bring (:class:`analysis.CompareOptions` adds them).
"""

from __future__ import annotations

from analysis.batch_statistics.analytic_null import AnalyticNullSums
from analysis.batch_statistics.bootstrap_terms import BootstrapTerms
from analysis.batch_statistics.cell_image_terms import CellImageTerms
from analysis.batch_statistics.image_moments import ImageIntervalMoments
from analysis.batch_statistics.layer_spectra import LayerSpectra
from analysis.batch_statistics.measures import WholeSampleMeasures
from analysis.batch_statistics.pair_image_terms import PairImageTerms
from analysis.batch_statistics.permutation_null import DrawnNull
from analysis.batch_statistics.protocol import BatchStatistic, Output, Setup, Switch
from analysis.batch_statistics.sensitivity import SensitivityFeatures
from analysis.errors import AnalysisError

__all__ = ["OUTPUTS", "STATISTICS", "SWITCHES", "start_wanted", "statistic"]

STATISTICS: tuple[type[BatchStatistic], ...] = (
    BootstrapTerms,
    ImageIntervalMoments,
    PairImageTerms,
    CellImageTerms,
    DrawnNull,
    LayerSpectra,
    SensitivityFeatures,
    WholeSampleMeasures,
    AnalyticNullSums,
)


def _declared(named: list[Output] | list[Switch], what: str) -> None:
    """Two statistics may declare one output alike (the intervals' two units), never unlike."""
    seen: dict[str, Output | Switch] = {}
    for item in named:
        if seen.setdefault(item.name, item) != item:
            raise AnalysisError(f"two statistics declare the {what} {item.name!r} differently")


_declared([o for cls in STATISTICS for o in cls.outputs], "output")
_declared([w for cls in STATISTICS for w in cls.switches], "option")
# Every array an atlas may carry, once each, in the registry's order.
OUTPUTS: tuple[Output, ...] = tuple({o.name: o for cls in STATISTICS for o in cls.outputs}.values())
# Every option the statistics bring, once each.
SWITCHES: tuple[Switch, ...] = tuple(
    {w.name: w for cls in STATISTICS for w in cls.switches}.values()
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
