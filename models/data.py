"""What training needs of a dataset, said here so that :mod:`models` never imports :mod:`analysis`.

:mod:`models` is the lower library. A labelled image dataset is any object with the attributes
of :class:`LabelledImages` — :class:`analysis.ImageDataset` is one, so a notebook goes::

    digits = analysis.training_data("digits")       # digits' fixed (train, test) splits
    path = models.train("mlp_digits", digits, seed=0, epochs=1)

:func:`models.train` takes either a ``(train, test)`` pair, used as given, or one dataset, of
which it holds out a fixed fifth for testing. The checkpoint records the training data as a
plain ``{"name", "sha256"}`` record (:func:`dataset_record`).
"""

from __future__ import annotations

import os
from typing import Protocol, TypeAlias

import numpy as np

from models.errors import ConfigError

__all__ = ["LabelledImages", "TrainingData", "dataset_record", "training_splits"]

_HOLDOUT_FRACTION = 0.2  # test share of a dataset given whole, which has no split of its own


class LabelledImages(Protocol):
    """Images (N, C, H, W) in ``x``, class indices in ``y``, a name and a content sha256."""

    @property
    def name(self) -> str: ...

    @property
    def sha256(self) -> str: ...

    @property
    def x(self) -> np.ndarray: ...

    @property
    def y(self) -> np.ndarray | None: ...

    @property
    def shape(self) -> tuple[int, int, int]: ...

    @property
    def num_classes(self) -> int | None: ...

    def __len__(self) -> int: ...


# A (train, test) pair, or one dataset of which training holds out a fixed fifth.
TrainingData: TypeAlias = LabelledImages | tuple[LabelledImages, LabelledImages]


def dataset_record(data: LabelledImages) -> dict[str, str]:
    """The identity a checkpoint records of its data: ``{"name", "sha256"}``."""
    return {"name": data.name, "sha256": data.sha256}


def _labelled(data: object) -> LabelledImages:
    """``data`` itself, or a ConfigError saying why a model cannot be trained on it."""
    if isinstance(data, str | os.PathLike):
        raise ConfigError(
            f"training needs a labelled image dataset, not the name {os.fspath(data)!r}: "
            f"load it first, e.g. analysis.training_data({os.fspath(data)!r})"
        )
    name = getattr(data, "name", type(data).__name__)
    if not hasattr(data, "sha256"):
        raise ConfigError(
            f"training needs a labelled image dataset (name, sha256, x, y); {name!r} is not one"
        )
    if not hasattr(data, "x"):
        raise ConfigError(
            f"the images of {name} have different sizes; training needs one size "
            "(comparisons resize them per model)"
        )
    if getattr(data, "y", None) is None:
        raise ConfigError(f"dataset {name} has no labels, so a model cannot be trained on it")
    return data  # type: ignore[return-value]  # checked attribute by attribute above


def training_splits(data: TrainingData) -> tuple[LabelledImages, LabelledImages]:
    """(train, test): a pair as given, or a fixed 80/20 holdout of one dataset."""
    if isinstance(data, tuple):
        if len(data) != 2:
            raise ConfigError("training data given as a tuple must be (train, test)")
        return _labelled(data[0]), _labelled(data[1])
    whole = _labelled(data)
    if len(whole) < 2:
        raise ConfigError(f"dataset {whole.name} needs at least two images to train and test")
    order = np.random.default_rng(0).permutation(len(whole))
    n_test = max(1, round(_HOLDOUT_FRACTION * len(whole)))
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    return _Subset(whole, train, "train"), _Subset(whole, test, "test")


class _Subset:
    """A fixed part of a dataset, with the parent's identity."""

    def __init__(self, parent: LabelledImages, index: np.ndarray, split: str) -> None:
        assert parent.y is not None  # _labelled checked it
        self.x, self.y = parent.x[index], parent.y[index]
        # The identity recorded is the parent's hash: the split is a fixed function of it.
        self.name, self.sha256 = f"{parent.name}:{split}", parent.sha256
        self.shape, self.num_classes = parent.shape, parent.num_classes

    def __len__(self) -> int:
        return len(self.x)
