"""A measure is one module: what the library knows of the measures it reads from
:data:`analysis.measures.registry.REGISTERED`.

A measure written here (the mean absolute canonical correlation's square root, with a flag of
its own) is registered for the length of one test, as a module of analysis/measures would be by
its line in ``REGISTERED``; the matrices, their flags and the memory estimate follow. What the
registry feeds at import (the options' choices, titles, the atlas's flag outputs) is checked
against the registered measures as they stand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.batch_statistics import registry as statistics
from analysis.measures import (
    MEASURES,
    REGISTERED,
    TITLES,
    Flag,
    Measure,
    estimate_bytes,
    measure_matrices,
)
from analysis.measures import registry as measures
from analysis.measures.protocol import Layer, Pair
from analysis.options import CompareOptions
from analysis.plot import MEASURE_TITLES


def _root_r2(pair: Pair) -> float:
    assert pair.x.factor is not None and pair.y.factor is not None
    c = min(pair.x.rank, pair.y.rank)
    return float(((pair.cross**2).sum() / c).sqrt())


def _narrow(x: Layer, y: Layer) -> bool:
    return min(x.rank, y.rank) < 3


NARROW = Flag("root_narrow", "a side under rank 3", "{count} cells are narrow", _narrow)
ROOT_R2 = Measure(
    "root_r2",
    "√R²",
    "tests: the square root of R²_CCA",
    _root_r2,
    needs=frozenset({"factor"}),
    flags=(NARROW,),
)


def test_a_registered_measure_is_computed_flagged_and_budgeted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(measures, "REGISTERED", (*REGISTERED, ROOT_R2))
    rng = np.random.default_rng(0)
    feats = [torch.from_numpy(rng.standard_normal((40, d))) for d in (6, 2, 5)]
    got = measure_matrices(feats, ["cca", "root_r2"])
    assert np.allclose(got.values["root_r2"], np.sqrt(got.values["cca"]))
    narrow = np.array([[d < 3 or e < 3 for e in (6, 2, 5)] for d in (6, 2, 5)])
    assert np.array_equal(got.flags["root_narrow"], narrow)
    # its memory is its needs': the kept fp32 features, each layer's basis and singular values
    # held, the largest layer's centred copy and SVD while it is factorised
    monkeypatch.setattr("analysis.measures.budget.use_projectors", lambda *_: False)
    n, widths = 40, [6, 2, 5]
    held = sum((n * min(n, d) + min(n, d)) * 8 for d in widths)
    working = max((2 * n * d + n * min(n, d) + min(n, d) * d) * 8 for d in widths)
    assert estimate_bytes(n, widths, ["root_r2"]) == n * sum(widths) * 4 + held + working


def test_what_the_library_offers_is_the_registry() -> None:
    names = [m.name for m in REGISTERED]
    assert list(MEASURES) == names
    assert TITLES == MEASURE_TITLES == {m.name: m.title for m in REGISTERED}
    choices = CompareOptions.model_json_schema()["properties"]["measures"]["items"]["enum"]
    assert choices == names
    for m in REGISTERED[1:]:
        assert f"`{m.name}` ({m.title})" in (
            CompareOptions.model_fields["measures"].description or ""
        )
    flags = {flag.name for m in REGISTERED for flag in m.flags}
    outputs = {o.name for o in statistics.OUTPUTS if o.kind == "flags"}
    assert flags == outputs == {f.name for f in measures.FLAGS}
