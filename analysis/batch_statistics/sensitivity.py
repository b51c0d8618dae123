"""The sensitivity's features: every layer's features over the kept batches, in batch order.

With ``sensitivity=True`` each cell's CKA is recomputed with the row layer's top principal
direction *of the whole sample* removed
(:func:`analysis.estimators.spectrum.whole_sample_sensitivity`), which needs every layer's
features at once. They are not a batch's Grams: the engine hands each
layer's features to :attr:`SensitivityFeatures.kept` as it reads them (or reads them back from
the Gram store), so :meth:`SensitivityFeatures.update` has nothing left to do. A CUDA run keeps
them on the GPU where there is room (:mod:`analysis.engine.kept`); the state holds them as they
are, and a shard's file as numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch

from analysis.atlas import Atlas
from analysis.batch_statistics.protocol import Batch, Diagnose, Needs, Setup, State
from analysis.engine.kept import KeptFeatures
from analysis.estimators.hsic import cka_from_hsic
from analysis.estimators.spectrum import whole_sample_sensitivity
from analysis.options import CompareOptions

__all__ = ["SensitivityFeatures"]


class SensitivityFeatures:
    """The kept features (``layer.<k>``: (n, d)) and the samples of each kept batch (``sizes``)."""

    key: ClassVar[str] = "features"
    needs: ClassVar[Needs] = "features"

    def __init__(self, setup: Setup) -> None:
        self.kept = KeptFeatures(
            setup.layers, None, setup.device
        )  # planned batches: set by the run

    @classmethod
    def wanted(cls, options: CompareOptions) -> bool:
        return bool(options.sensitivity)

    @classmethod
    def start(cls, setup: Setup) -> SensitivityFeatures:
        return cls(setup)

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

    @classmethod
    def finish(cls, atlas: Atlas, state: State, batches: int) -> Diagnose | None:
        width = sum(k.startswith("layer.") for k in state)
        features = [torch.as_tensor(state[f"layer.{k}"]) for k in range(width)]
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


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts one after the other, on the host; one alone as it is, on its device (a layer's
    kept features can run to gigabytes, and ``compare`` is one shard, whose features a CUDA
    run keeps on the GPU)."""
    return parts[0] if len(parts) == 1 else torch.cat([torch.as_tensor(p).cpu() for p in parts])
