"""The image-level interval's moments: sums over images of products of their HSIC terms.

With ``interval="images"`` every cell's interval comes from the first-order Hoeffding projection
(:mod:`analysis.inference.image_intervals`); its three sums add over batches and ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from analysis.batch_statistics.protocol import (
    Batch,
    Diagnose,
    Finishing,
    Needs,
    Options,
    Output,
    Setup,
    State,
    Switch,
    Tick,
    sum_states,
)
from analysis.inference.image_intervals import ImageMoments, image_intervals

__all__ = ["INTERVAL", "ImageIntervalMoments"]

# A cell's 95 % interval (shared with the batch bootstrap: either unit gives the same arrays).
INTERVAL = (
    Output("ci_low", "cells", blocks=True, always=True),
    Output("ci_high", "cells", blocks=True, always=True),
)


class ImageIntervalMoments:
    """:class:`ImageMoments` of every kept batch, finished into ``ci_low``/``ci_high``."""

    key: ClassVar[str] = "moments"
    needs: ClassVar[Needs] = "grams"
    outputs: ClassVar[tuple[Output, ...]] = INTERVAL
    switches: ClassVar[tuple[Switch, ...]] = ()

    def __init__(self, setup: Setup) -> None:
        self.moments = ImageMoments(setup.layers, setup.device)
        self.estimator = setup.options.estimator

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return options.mode == "minibatch" and options.interval == "images"

    @classmethod
    def start(cls, setup: Setup) -> ImageIntervalMoments:
        return cls(setup)

    def update(self, batch: Batch) -> None:
        self.moments.add_terms(batch.image_terms(self.estimator))

    def state(self) -> State:
        return self.moments.state()

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return sum_states(states, "image moments")

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        done.values["ci_low"], done.values["ci_high"] = image_intervals(done.hsic, state)
        return None
