"""What a measure is: one declaration, from which the rest of the library derives it.

A measure is one module of :mod:`analysis.measures` holding a :class:`Measure` (the CCA
family's module holds four) and its line in :mod:`analysis.measures.registry`. It declares:

* ``name``: its key in the options (``measures``), the atlas (``measures/<name>``), the REST
  body and the exports; ``title``: how a heatmap, the page and a table name it;
* ``needs``: what of each layer its pairs read (:data:`Need`), and so its memory per layer
  (:func:`analysis.measures.budget.estimate_bytes` adds up what the wanted measures need);
* ``pair``: its value between two prepared layers (:class:`Pair`), and ``projected`` with
  ``projectors``: the same for every pair at once, where it has that route
  (:mod:`analysis.measures.projected`);
* ``flags``: the conditions under which its value says more about the sample's size than about
  the layers (:class:`Flag`): each flagged cell is stored beside the value, marked on the
  heatmaps, counted in the CLI's lines and written in the exports and the REST body.

Its result serialises as every measure's does: a (L, L) matrix of floats under its name, and
per flag a (L, L) matrix of booleans under the flag's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from analysis.measures.factor import Factor

if TYPE_CHECKING:
    from analysis.measures.projected import Projectors

__all__ = ["Flag", "Layer", "Measure", "Need", "Pair"]

# What a measure reads of each layer: its factorisation (analysis.measures.factor), with the
# loadings Qᵀ X too, or each sample's k nearest neighbours (analysis.measures.mutual_knn).
Need = Literal["factor", "loadings", "neighbours"]


@dataclass(frozen=True)
class Layer:
    """One layer prepared for its pairs: ``n`` samples, ``k`` neighbours asked for, and what
    the wanted measures need of it (None where none needs it)."""

    n: int
    k: int
    factor: Factor | None = None
    neighbours: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        """The centred features' numerical rank (the factorisation's)."""
        assert self.factor is not None
        return self.factor.rank

    @property
    def spans_sample(self) -> bool:
        """Whether the centred features span every centred direction of the sample (rank
        n − 1): any other layer's features are then a linear image of these."""
        return self.rank >= self.n - 1


class Pair:
    """Two prepared layers, with what several measures read of them computed once: the
    cross product of their bases M = Q_xᵀ Q_y and its SVD."""

    def __init__(self, x: Layer, y: Layer) -> None:
        self.x, self.y = x, y

    @cached_property
    def cross(self) -> torch.Tensor:
        """M = Q_xᵀ Q_y (r_x × r_y): its singular values are the canonical correlations."""
        assert self.x.factor is not None and self.y.factor is not None
        return self.x.factor.q.T @ self.y.factor.q

    @cached_property
    def canonical(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """M's thin SVD (A, ρ, Bᵀ)."""
        a, rho, bh = torch.linalg.svd(self.cross, full_matrices=False)
        return a, rho, bh


@dataclass(frozen=True)
class Flag:
    """A condition under which a measure's value of a cell is fixed, or mostly fixed, by the
    sample's size rather than by the layers (docs/measures.md, "Flags").

    ``name``: its key in the atlas, the REST body and the exports (one flag may serve several
    measures: the CCA family's ``cca_degenerate``); ``label``: a few words, for the tooltip and
    the heatmap's legend; ``warning``: the sentence of the diagnostics and the CLI, with
    ``{count}`` for the cells flagged; ``raised``: whether a cell between two prepared layers
    is flagged."""

    name: str
    label: str
    warning: str
    raised: Callable[[Layer, Layer], bool]

    def sentence(self, count: int) -> str:
        """The warning for ``count`` flagged cells."""
        return self.warning.format(count=count)


def _no_pair(pair: Pair) -> float:
    raise NotImplementedError("CKA is streamed per batch by the engine, not computed per pair")


@dataclass(frozen=True)
class Measure:
    """One similarity measure; see the module docstring. ``summary``: what it computes, in a
    line (:data:`analysis.measures.MEASURES`). ``streamed``: CKA's own declaration (the engine
    computes it per batch, :mod:`analysis.estimators.hsic`); every other measure needs the
    whole sample's features at once."""

    name: str
    title: str
    summary: str
    pair: Callable[[Pair], float] = _no_pair
    needs: frozenset[Need] = frozenset()
    flags: tuple[Flag, ...] = ()
    projected: Callable[[Projectors], np.ndarray] | None = None
    projectors: frozenset[str] = frozenset()
    streamed: bool = False
