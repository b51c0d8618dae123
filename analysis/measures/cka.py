"""CKA's declaration among the measures: the engine's own, streamed per batch
(:mod:`analysis.estimators.hsic`), never computed from the kept features."""

from __future__ import annotations

from analysis.measures.protocol import Measure

__all__ = ["CKA"]

CKA = Measure("cka", "CKA", "analysis.estimators.hsic (streamed, per batch)", streamed=True)
