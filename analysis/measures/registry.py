"""Every measure, in the order the options, the atlas and the exports list them.

Registering a measure is adding its :class:`~analysis.measures.protocol.Measure` here; its name
must be new. What the rest of the library derives from the registered measures is here too:
:data:`FLAGS`, every flag once (:class:`analysis.batch_statistics.measures.WholeSampleMeasures`
stores each as an output of its own).
"""

from __future__ import annotations

from analysis.errors import AnalysisError
from analysis.measures.cca import CCA, CCA_MEAN, PWCCA, SVCCA
from analysis.measures.cka import CKA
from analysis.measures.linreg import LINREG
from analysis.measures.mutual_knn import MUTUAL_KNN
from analysis.measures.procrustes import PROCRUSTES
from analysis.measures.protocol import Flag, Measure

__all__ = ["FLAGS", "REGISTERED", "flags_of", "measure"]

REGISTERED: tuple[Measure, ...] = (
    CKA,
    CCA,
    CCA_MEAN,
    SVCCA,
    PWCCA,
    LINREG,
    PROCRUSTES,
    MUTUAL_KNN,
)


def _flags(measures: tuple[Measure, ...]) -> tuple[Flag, ...]:
    """Every flag of ``measures`` once; two measures may share a flag, never a name for two."""
    seen: dict[str, Flag] = {}
    for m in measures:
        for flag in m.flags:
            if seen.setdefault(flag.name, flag) is not flag:
                raise AnalysisError(f"two measures declare the flag {flag.name!r} differently")
    return tuple(seen.values())


if len({m.name for m in REGISTERED}) != len(REGISTERED):
    raise AnalysisError("two measures are registered under one name")
FLAGS: tuple[Flag, ...] = _flags(REGISTERED)


def measure(name: str) -> Measure:
    """The registered measure named ``name``."""
    for m in REGISTERED:
        if m.name == name:
            return m
    raise AnalysisError(f"no measure {name!r}; known: {', '.join(m.name for m in REGISTERED)}")


def flags_of(name: str) -> tuple[Flag, ...]:
    """The flags of the measure named ``name`` (none for an unknown one)."""
    return next((m.flags for m in REGISTERED if m.name == name), ())
