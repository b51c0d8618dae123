"""The comparison plan: its phases and their weights, progress that reads 1 only at the end, and
a stop that reaches the finish (the whole-sample measures, between pairs of layers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import analysis
import models
from analysis.comparison.plan import Progress

X = torch.randn(60, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def _nets() -> dict[str, torch.nn.Module]:
    return {"a": models.create("mixer_digits", seed=0), "b": models.create("gmlp_digits", seed=1)}


def test_the_plan_weighs_each_phase_by_the_networks_it_runs() -> None:
    nets = _nets()
    opts = analysis.CompareOptions.build(
        batch_size=20, baselines="random_init", random_init_draws=2, measures="cca,procrustes"
    )
    plan = analysis.plan_comparison(analysis.members_of(nets, opts), opts, batches=3)
    # the two models; two twins of each per draw; the measures, one more pass of the models
    assert dict(plan.weights) == {"run": 2, "random_init": 2 * 2 * 2, "measures": 2}
    assert plan.labels == ["a", "b"] and plan.shards == () and plan.ceiling is None
    assert plan.layers["a"][0] == "stem"
    split = analysis.plan_comparison(
        analysis.members_of(nets, opts), opts, batches=7, shards=2, max_shards=8
    )
    assert split.shards == (range(0, 4), range(4, 7))
    many = analysis.plan_comparison(
        analysis.members_of(nets, opts), opts, batches=7, shard_batches=2
    )
    assert [len(r) for r in many.shards] == [2, 2, 2, 1]


def test_progress_reads_done_only_at_the_end() -> None:
    seen: list[tuple[int, int]] = []
    progress = Progress(lambda d, t: seen.append((d, t)), {"run": 2, "measures": 2}, 3)
    run = progress.phase("run")
    assert run is not None
    for k in range(1, 4):
        run(k, 3)
    assert seen[-1] == (6, 12)  # the run: half the work
    tick = progress.ticker("measures")
    tick(1, 2)
    tick(2, 2)  # the measures' last step: still not the end
    assert seen[-1] == (11, 12)
    tick(1, 4)  # a later step of the phase never takes progress back
    assert seen[-1] == (11, 12)
    progress.done()
    assert seen[-1] == (12, 12) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_stop_reaches_the_measures_between_pairs() -> None:
    calls: list[float] = []

    def on_batch(done: int, total: int) -> bool:
        calls.append(done / total)
        return done / total <= 0.6  # past the run's half: stop, in the measures

    with pytest.raises(analysis.Cancelled, match="measures"):
        analysis.compare(
            _nets(), X, batch_size=20, measures="cca,procrustes", on_batch=on_batch, device="cpu"
        )
    # the run's 3 batches took half the progress; the measures moved it on, then stopped
    assert calls[2] == pytest.approx(0.5)
    assert 0.5 < calls[-1] < 1 and len(calls) > 4
    assert np.all(np.diff(calls) >= 0)


def test_without_a_stop_the_measures_count_and_the_end_is_one() -> None:
    calls: list[tuple[int, int]] = []
    atlas = analysis.compare(
        _nets(),
        X,
        batch_size=20,
        measures="cca",
        on_batch=lambda d, t: calls.append((d, t)),
        device="cpu",
    )
    assert atlas.measures is not None and "cca" in atlas.measures
    fractions = [d / t for d, t in calls]
    assert fractions[-1] == 1.0 and max(fractions[:-1]) < 1.0
    assert any(0.5 < f < 1.0 for f in fractions)  # the measures' own steps
