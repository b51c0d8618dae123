"""The analytic null's tail (analysis.inference.analytic_null, analysis.inference.null_draws):
heavy-tailed low-rank layers, where three moments do not pin the null down, get permutation p-values
that hold.

Expectations: rates of p < α under independence (a valid p-value has P(p < α) ≤ α, and a good
one ≈ α), exact permutation distributions enumerated here, and HSIC written out here (U-centring
by its definition), never the code under test.
"""

from __future__ import annotations

import itertools
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from analysis.inference.analytic_null import AnalyticNull, finish
from analysis.inference.null_draws import (
    EXCEEDANCES,
    KEEP_BYTES,
    MAX_DRAWS,
    KeptCentred,
    complete_layers,
    moment_bound,
    monte_carlo_p,
)

# independent pairs per batch size: at 4,000 the binomial sd at α = 0.01 is 0.0016 and the
# band [0.005, 0.015] ±3 sd; the cheap small batches take more
REPLICATES = {16: 8000, 50: 4000, 150: 4000}
CHUNK = 40  # replicates per run of the accumulator (2 layers each)


def _cubed(kind: str, count: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` independent layers of n samples: cubed Gaussians of rank 1 or 2."""
    if kind == "rank1":
        return rng.normal(size=(count, n, 1)) ** 3
    return rng.normal(size=(count, n, 2)) ** 3 @ rng.normal(size=(count, 2, 3))


def _u_centred(grams: np.ndarray) -> np.ndarray:
    """Székely & Rizzo's U-centring of a stack of Grams (…, n, n), written out."""
    n = grams.shape[-1]
    z = grams * (1 - np.eye(n))
    r, s = z.sum(-1), z.sum((-2, -1))
    u = z - r[..., :, None] / (n - 2) - r[..., None, :] / (n - 2)
    u += (s / ((n - 1) * (n - 2)))[..., None, None]
    return u * (1 - np.eye(n))


def _unbiased_hsic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Unbiased HSIC of linear kernels over the samples (axis -2) of stacks of features, from
    the features alone (Song et al. 2012, with K̃ = XXᵀ less its diagonal):
    [tr K̃L̃ + 1ᵀK̃1 1ᵀL̃1 / ((n-1)(n-2)) - 2/(n-2) 1ᵀK̃L̃1] / (n(n-3))."""
    n = x.shape[-2]
    kd, ld = (x * x).sum(-1), (y * y).sum(-1)  # the Grams' diagonals
    trace = (np.swapaxes(x, -1, -2) @ y) ** 2
    trace = trace.sum((-2, -1)) - (kd * ld).sum(-1)
    k1 = (x @ x.sum(-2)[..., :, None])[..., 0] - kd  # K̃1
    l1 = (y @ y.sum(-2)[..., :, None])[..., 0] - ld
    total = k1.sum(-1) * l1.sum(-1) / ((n - 1) * (n - 2)) - 2 / (n - 2) * (k1 * l1).sum(-1)
    return (trace + total) / (n * (n - 3))


def _tail_p(kind: str, size: int, batches: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """p-values and their methods of REPLICATES[size] independent pairs of layers, each pair
    two layers of one run (CHUNK pairs share a run), over ``batches`` batches of ``size``."""
    rng = np.random.default_rng(seed)
    ps, methods = [], []
    layers = 2 * CHUNK
    pairs = (np.arange(0, layers, 2), np.arange(1, layers, 2))
    tests = np.zeros((layers, layers), dtype=bool)
    tests[pairs] = True
    for _ in range(REPLICATES[size] // CHUNK):
        feats = _cubed(kind, layers, size * batches, rng)
        null = AnalyticNull(layers, "unbiased", torch.float32, keep=KEEP_BYTES)
        hsic = np.zeros((layers, layers))
        for b in range(batches):
            part = feats[:, b * size : (b + 1) * size]
            for layer, f in enumerate(part):  # as the engine does for a linear kernel
                null.keep_features(b, layer, torch.from_numpy(f))
            grams = part @ np.swapaxes(part, 1, 2)
            null.add(torch.from_numpy(grams.astype(np.float32)), batch=b)
            hsic[np.arange(layers), np.arange(layers)] += _unbiased_hsic(part, part)
            cross = _unbiased_hsic(part[pairs[0]], part[pairs[1]])
            hsic[pairs] += cross
            hsic[pairs[1], pairs[0]] += cross
        summary, _ = finish(null.state(), hsic, "unbiased", seed, batches, tests)
        assert summary.p_method is not None
        ps.append(summary.p_value[pairs])
        methods.append(summary.p_method[pairs])
    return np.concatenate(ps), np.concatenate(methods)


def test_the_harness_hsic_is_the_reference(ref: types.SimpleNamespace) -> None:
    rng = np.random.default_rng(1)
    x, y = _cubed("rank2", 2, 16, rng)
    want = ref.hsic(x @ x.T, y @ y.T, "unbiased")
    assert _unbiased_hsic(x, y) == pytest.approx(want, rel=1e-10)
    assert _unbiased_hsic(x[None], y[None])[0] == pytest.approx(want, rel=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["rank1", "rank2"])
@pytest.mark.parametrize(("size", "batches"), [(16, 2), (50, 2), (150, 1)])
def test_independent_heavy_tailed_layers_reject_at_the_nominal_rate(
    kind: str, size: int, batches: int
) -> None:
    p, methods = _tail_p(kind, size, batches, seed=10 * size + (kind == "rank2"))
    assert len(p) == REPLICATES[size] and np.isfinite(p).all()
    assert 0.005 <= np.mean(p < 0.01) <= 0.015, np.mean(p < 0.01)
    assert 0.035 <= np.mean(p < 0.05) <= 0.065, np.mean(p < 0.05)
    # the tail check is what holds them: nearly every pair draws permutations
    assert np.mean(methods == "monte_carlo") > 0.95


def _exact_null(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_ij a_ij b_π(i)π(j) over all n! permutations π (the test's own gather)."""
    perms = np.array(list(itertools.permutations(range(len(a)))))
    return (a[None] * b[perms[:, :, None], perms[:, None, :]]).sum((1, 2))


def _two_batches(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two batches of 7 of a pair of rank-1 cubed Gaussian layers, weakly dependent."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(14, 1))
    x, y = (z + 0.6 * rng.normal(size=(14, 1))) ** 3, (z + 0.6 * rng.normal(size=(14, 1))) ** 3
    return [x[:7], x[7:]], [y[:7], y[7:]]


def test_monte_carlo_p_follows_the_exact_permutation_p() -> None:
    """Two batches of 7: the null is every pair of 7! permutations, 25 million sums, so the
    exact p is counted here; Besag & Clifford's p (h = 10) is within its noise of it, and
    the narrow-feature path gives the very same draws as the Gram path."""
    ratios = []
    for seed in range(12):
        xs, ys = _two_batches(seed)
        us = [[_u_centred(f @ f.T) for f in side] for side in (xs, ys)]
        norm = 7 * 4
        null = [np.sort(_exact_null(a, b) / norm) for a, b in zip(*us, strict=True)]
        observed = sum((a * b).sum() / norm for a, b in zip(*us, strict=True))
        # P(T1 + T2 ≥ observed) over all pairs, by sorting one side
        reach = len(null[1]) - np.searchsorted(null[1], observed - null[0] - 1e-9, side="left")
        exact = reach.sum() / len(null[0]) / len(null[1])
        got = {}
        for form in ("grams", "features"):
            kept = KeptCentred("unbiased")
            for batch in range(2):
                if form == "features":
                    kept.add_features(batch, 0, torch.from_numpy(xs[batch]))
                    kept.add_features(batch, 1, torch.from_numpy(ys[batch]))
                else:
                    u = np.stack([us[0][batch], us[1][batch]])
                    kept.add(batch, 0, torch.from_numpy(u))
            entries = complete_layers(kept.state(), "unbiased", 2, {0, 1})
            assert (entries[0][0].features is not None) == (form == "features")
            own = [sum((u * u).sum() / norm for u in side) for side in us]
            p, draws = monte_carlo_p(
                entries, np.array([[0, 1]]), np.sqrt([own[0] * own[1]]), "unbiased", seed
            )
            got[form] = (float(p[0]), int(draws[0]))
        assert got["grams"] == got["features"]
        p_mc, draws = got["grams"]
        if p_mc > EXCEEDANCES / MAX_DRAWS:  # stopped at the h-th exceedance
            assert p_mc == pytest.approx(EXCEEDANCES / draws)
        ratios.append(p_mc / exact)
    # h/L has a relative spread of about 1/sqrt(h) and a small upward bias
    assert 0.8 <= np.mean(ratios) <= 1.4, ratios
    assert min(ratios) >= 0.3 and max(ratios) <= 3, ratios


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_the_moment_bound_holds_over_every_permutation(estimator: str) -> None:
    from analysis.estimators.hsic import centred_rows
    from analysis.inference.null_moments import batch_moments, layer_invariants

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 1)) ** 3, rng.normal(size=(8, 2)) ** 3
    grams = torch.from_numpy(np.stack([x @ x.T, y @ y.T]))
    f, _ = centred_rows(grams, estimator)
    sums = batch_moments(layer_invariants(f.view(2, 8, 8), estimator).numpy(), 8, estimator)
    h = np.eye(8) - 1 / 8
    a, b = (
        (_u_centred(g) for g in grams.numpy())
        if estimator == "unbiased"
        else (h @ g @ h for g in grams.numpy())
    )
    values = _exact_null(a, b) / (8 * 5 if estimator == "unbiased" else 49)
    mean, sd = values.mean(), values.std()
    fourth = sums[5, 0, 1] if estimator == "unbiased" else None
    for k in (0.5, 1, 2, 3, 5):
        tail = np.mean(values - mean >= k * sd)
        bound = moment_bound(np.array([k * sd]), np.array([sd]), fourth and np.array([fourth]))
        assert tail <= bound[0] + 1e-12, (k, tail, bound)
    if estimator == "unbiased":  # the fourth moment tightens Cantelli far out
        far = moment_bound(np.array([5 * sd]), np.array([sd]), np.array([fourth]))[0]
        assert far < 1 / (1 + 25)


class _Cube(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x**3


def _heavy(half: int) -> torch.nn.Module:
    """Layers "2" (a cubed Gaussian, rank 1) and "4" (rank 2) of one half of a 4×4 input:
    two such models read disjoint halves, so they are independent."""
    net = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(16, 1, bias=False),
        _Cube(),
        torch.nn.Linear(1, 2),
        _Cube(),
    )
    with torch.no_grad():
        w = torch.zeros(1, 16)
        w[0, 8 * half : 8 * half + 8] = 1 / np.sqrt(8)
        net[1].weight.copy_(w)
        net[3].weight.copy_(torch.tensor([[1.0], [-0.5]]))
        net[3].bias.copy_(torch.tensor([0.3, 1.0]))
    return net


def _heavy_compare(**kw: Any) -> Any:
    from analysis import compare

    x = torch.randn(96, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    nets = {"a": _heavy(0), "c": _heavy(1)}
    return compare(nets, x, layers=["2", "4"], batch_size=32, device="cpu", **kw)


def test_heavy_tailed_cells_draw_permutations_and_shards_add_up(tmp_path: Path) -> None:
    from analysis import Atlas, Partial, combine, compare_partial, shard_ranges

    atlas = _heavy_compare()
    methods, draws = atlas.p_method("a", "c"), atlas.p_draws("a", "c")
    assert methods is not None and draws is not None
    assert (methods == "monte_carlo").all() and (draws > 0).all()
    record = atlas.diagnostics["null"]
    assert record["flagged"] == 6 and record["without_draws"] == 0  # every pair of layers
    assert record["monte_carlo"] == 4 and record["draws"] == draws.sum()
    # a model's two layers are one function of the other: far out, settled by the bound,
    # and a layer with itself is not a test
    own, own_p = atlas.p_method("a"), atlas.p_values("a")
    assert own is not None and own_p is not None
    assert own[0, 1] == own[1, 0] == "bound" and own_p[0, 1] <= 1 / (MAX_DRAWS + 1)
    assert own[0, 0] == "analytic"
    # ranges of the plan, through their files, give the same atlas
    x = torch.randn(96, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    nets = {"a": _heavy(0), "c": _heavy(1)}
    kw: dict[str, Any] = {"layers": ["2", "4"], "batch_size": 32, "device": "cpu"}
    paths = []
    for k, r in enumerate(shard_ranges(3, 2)):
        compare_partial(nets, x, batches=r, **kw).save(tmp_path / f"{k}.partial")
        paths.append(tmp_path / f"{k}.partial")
    whole = combine([Partial.load(p) for p in paths])
    np.testing.assert_allclose(whole.p_values("a", "c"), atlas.p_values("a", "c"), rtol=1e-9)
    assert (whole.p_method("a", "c") == methods).all()
    assert (whole.p_draws("a", "c") == draws).all()
    # and the atlas's JSON keeps what each p rests on
    back = Atlas.from_dict(atlas.to_dict())
    assert (back.p_method("a", "c") == methods).all() and (back.p_draws("a", "c") == draws).all()
    assert atlas.to_dict()["matrices"][1]["p_method"] == methods.tolist()


def test_the_gram_store_reads_back_only_the_grams_the_draws_need(tmp_path: Path) -> None:
    from analysis import DirectoryGramCache

    plain = _heavy_compare()
    read: list[str] = []

    class Store(DirectoryGramCache):
        def get(self, key: str) -> np.ndarray | None:
            got = super().get(key)
            if got is not None and got.ndim == 3:  # a model's Grams
                read.append(key)
            return got

    store = Store(str(tmp_path))
    keys = {"a": "ka", "c": "kc"}
    _heavy_compare(gram_cache=store, model_keys=keys)
    assert not read
    again = _heavy_compare(gram_cache=store, model_keys=keys)
    assert again.diagnostics["forward_passes"] == {"a": 0, "c": 0}
    assert len(read) == 2 * 3  # both models' Grams of the three batches, once, after the pass
    for name in ("p_values", "p_method", "p_draws"):
        np.testing.assert_array_equal(
            getattr(again, name)("a", "c"), getattr(plain, name)("a", "c")
        )


def test_without_room_for_the_grams_flagged_cells_keep_the_fit_and_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("analysis.batch_statistics.analytic_null.KEEP_BYTES", 1000)
    atlas = _heavy_compare()
    methods = atlas.p_method("a", "c")
    assert methods is not None and (methods == "analytic").all()
    record = atlas.diagnostics["null"]
    assert record["without_draws"] == record["flagged"] - record["bound"] == 4
    assert record["kept"].startswith("none")
    assert any("null: permutation" in w for w in atlas.warnings)


def test_cka_test_says_what_its_p_rests_on() -> None:
    from analysis import cka_test

    rng = np.random.default_rng(0)
    heavy = cka_test(rng.normal(size=(64, 1)) ** 3, rng.normal(size=(64, 1)) ** 3, batch_size=32)
    assert heavy.method == "analytic" and heavy.p_method == "monte_carlo" and heavy.draws > 0
    plain = cka_test(rng.normal(size=(64, 5)), rng.normal(size=(64, 4)), batch_size=32)
    assert plain.p_method == "analytic" and plain.draws == 0
    shuffled = cka_test(rng.normal(size=(64, 5)), rng.normal(size=(64, 4)), permutations=99)
    assert shuffled.p_method == "permutation" and shuffled.draws == 99


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_narrow_features_draw_what_their_grams_draw(estimator: str) -> None:
    """Kept as features (linear kernel, d < n/2) or as the centred Gram, a layer gives the same
    statistic, so the same p and draws: ‖Xᵀ P Y‖² (less a diagonal term, unbiased)."""
    from analysis.estimators.hsic import centred_rows
    from analysis.inference.null_moments import u_centre

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(30, 3)) ** 3 + 5, rng.normal(size=(30, 2)) ** 3 - 2  # off-centre
    f, _ = centred_rows(torch.from_numpy(np.stack([x @ x.T, y @ y.T])), estimator)
    centred = f.view(2, 30, 30)
    grams, feats = KeptCentred(estimator), KeptCentred(estimator)
    grams.add(0, 0, u_centre(centred) if estimator == "unbiased" else centred)
    feats.add_features(0, 0, torch.from_numpy(x))
    feats.add_features(0, 1, torch.from_numpy(y))
    results = []
    for kept in (grams, feats):
        entries = complete_layers(kept.state(), estimator, 1, {0, 1})
        own = [float(np.vdot(e[0].square, e[0].square)) for e in (entries[0], entries[1])]
        cells, scale = np.array([[0, 1]]), np.sqrt([own[0] * own[1]])
        results.append(monte_carlo_p(entries, cells, scale, estimator, seed=1))
    (p0, d0), (p1, d1) = results
    assert p0 == p1 and (d0 == d1).all() and 0 < d0[0] <= MAX_DRAWS
