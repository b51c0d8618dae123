"""A batch statistic is one module: its class declares its outputs and its option, and the
options, the run, the shards, the combine and the atlas's JSON form follow from the registry.

A statistic written here (the largest per-batch HSIC term of every cell, behind an option of its
own) is registered for the length of one test, as a module of analysis/batch_statistics would be
by its line in ``STATISTICS``; nothing else of the library is told about it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np
import pytest
import torch

import analysis
import models
from analysis.batch_statistics import registry
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
)
from analysis.options import CompareOptions, add_switches, option_specs

SWITCH = Switch("hsic_max", bool, False, "Also keep each cell's largest per-batch HSIC term.")


class LargestTerm:
    """Each cell's largest per-batch HSIC term: ranges join by their maximum."""

    key: ClassVar[str] = "largest"
    needs: ClassVar[Needs] = "hsic"
    outputs: ClassVar[tuple[Output, ...]] = (Output("hsic_max", "cells", blocks=True),)
    switches: ClassVar[tuple[Switch, ...]] = (SWITCH,)

    def __init__(self, layers: int) -> None:
        self.top = np.full((layers, layers), -np.inf)

    @classmethod
    def wanted(cls, options: Options) -> bool:
        return bool(getattr(options, "hsic_max", False))

    @classmethod
    def start(cls, setup: Setup) -> LargestTerm:
        return cls(setup.layers)

    def update(self, batch: Batch) -> None:
        self.top = np.maximum(self.top, batch.hsic)

    def state(self) -> State:
        return {"top": self.top}

    @classmethod
    def join(cls, states: Sequence[State]) -> State:
        return {"top": np.maximum.reduce([np.asarray(s["top"]) for s in states])}

    @classmethod
    def finish(cls, state: State, done: Finishing, batches: int, tick: Tick) -> Diagnose | None:
        done.values["hsic_max"] = np.asarray(state["top"])
        return None


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """LargestTerm's line in the registry, and its option added to CompareOptions, for one
    test (the option is taken out again after)."""
    monkeypatch.setattr(registry, "STATISTICS", (*registry.STATISTICS, LargestTerm))
    monkeypatch.setattr(registry, "OUTPUTS", (*registry.OUTPUTS, *LargestTerm.outputs))
    add_switches(CompareOptions, LargestTerm.switches)
    yield
    del CompareOptions.__pydantic_fields__[SWITCH.name]
    CompareOptions.model_rebuild(force=True)


def test_a_statistic_brings_its_option_and_output(registered: None) -> None:
    spec = option_specs()["hsic_max"]
    assert (spec.kind, spec.default, spec.description) == ("flag", False, SWITCH.description)
    with pytest.raises(analysis.OptionsError, match=r"^hsic_max: "):
        CompareOptions.build(hsic_max="sometimes")
    nets = {"a": models.create("mixer_digits", seed=0), "b": models.create("mlp_digits", seed=1)}
    x = torch.randn(90, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    atlas = analysis.compare(nets, x, batch_size=30, device="cpu", hsic_max=True)
    # independently: each batch compared alone, its HSIC terms, their maximum
    alone = [
        analysis.compare(nets, x[i : i + 30], batch_size=30, device="cpu") for i in (0, 30, 60)
    ]
    want = np.maximum.reduce([a.hsic for a in alone])
    np.testing.assert_allclose(atlas.values["hsic_max"], want, rtol=1e-9)
    # shards join by the statistic's own rule, and the JSON form carries the output both ways
    parts = [
        analysis.compare_partial(nets, x, batch_size=30, device="cpu", hsic_max=True, batches=r)
        for r in analysis.shard_ranges(3, 2)
    ]
    np.testing.assert_allclose(analysis.combine(parts).values["hsic_max"], want, rtol=1e-9)
    data = atlas.to_dict()
    assert np.allclose(data["hsic_max"], want)
    entry = data["matrices"][1]
    assert (entry["a"], entry["b"]) == ("a", "b")
    rows = len(atlas.layers["a"])
    np.testing.assert_allclose(entry["hsic_max"], want[:rows, rows:])
    back = analysis.Atlas.from_dict(data)
    np.testing.assert_allclose(back.values["hsic_max"], want)
    # off by default: not accumulated, not written
    plain = analysis.compare(nets, x, batch_size=30, device="cpu")
    assert "hsic_max" not in plain.values and "hsic_max" not in plain.to_dict()


def test_every_registered_output_is_declared_once() -> None:
    names = [o.name for o in registry.OUTPUTS]
    assert len(names) == len(set(names))
    assert set(names) >= {"ci_low", "p_value", "effective_dim", "measures", "cca_degenerate"}
