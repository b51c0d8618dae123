"""What the statistics that read every layer's features over the whole sample share.

The engine hands each layer's features of every kept batch to the :attr:`~FeatureStatistic.kept`
of such a statistic as it reads them (or reads them back from the Gram store), so
:meth:`FeatureStatistic.update` has nothing left to do; where several are wanted (the
sensitivity and the measures) they share one
:class:`~analysis.batch_statistics.kept.KeptFeatures`. A CUDA run keeps them on the GPU where
there is room; the state holds them as they are (``layer.<k>``: (n, d), and the samples of
each kept batch, ``sizes``), a shard's file as numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch

from analysis.batch_statistics.kept import KeptFeatures
from analysis.batch_statistics.protocol import Batch, Needs, Setup, State

__all__ = ["FeatureStatistic", "kept_layers"]


class FeatureStatistic:
    """The kept features of a run; a statistic that reads them finishes from them."""

    needs: ClassVar[Needs] = "features"

    def __init__(self, setup: Setup) -> None:
        self.kept = KeptFeatures(setup.layers, None, setup.device)  # planned: set by the run

    def update(self, batch: Batch) -> None:
        """Nothing: the engine adds each layer's features to :attr:`kept` as it reads them."""

    def state(self) -> State:
        layers = self.kept.layers()
        state: State = {f"layer.{k}": f for k, f in enumerate(layers)}
        return state | {"sizes": np.array(self.kept.sizes, dtype=np.int64)}

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        parts = [s for s in states if len(np.asarray(s["sizes"]))]  # a range may keep no batch
        width = sum(k.startswith("layer.") for k in parts[0]) if parts else 0
        joined: State = {
            f"layer.{k}": _joined([s[f"layer.{k}"] for s in parts]) for k in range(width)
        }
        sizes = [int(n) for s in parts for n in np.asarray(s["sizes"])]
        return joined | {"sizes": np.array(sizes, dtype=np.int64)}


def kept_layers(state: State) -> list[torch.Tensor]:
    """Each layer's features (n, d) of a joined state, in layer order."""
    width = sum(k.startswith("layer.") for k in state)
    return [torch.as_tensor(state[f"layer.{k}"]) for k in range(width)]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts one after the other, on the host; one alone as it is, on its device (a layer's
    kept features can run to gigabytes, and ``compare`` is one shard, whose features a CUDA
    run keeps on the GPU)."""
    return parts[0] if len(parts) == 1 else torch.cat([torch.as_tensor(p).cpu() for p in parts])
