"""The analytic permutation null (analysis.inference.null_moments) against permutations counted by
brute force.

Expectations: exact moments over all n! permutations of small batches, and ≥ 20,000 random
permutations whose HSIC is computed here with the feature-space identities below (checked
against the reference HSIC of ``conftest``), never with the code under test.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

import models
from analysis.data.datasets import load_digits
from analysis.estimators.hsic import centred_rows
from analysis.inference.analytic_null import AnalyticNull
from analysis.inference.null_moments import batch_moments, layer_invariants, q_values
from analysis.layers import LayerReader

PERMUTATIONS = 20_000


def _analytic(x: np.ndarray, y: np.ndarray, size: int, estimator: str) -> tuple[float, float]:
    """(observed CKA, analytic p) of features x, y over consecutive batches of ``size``."""
    null = AnalyticNull(2, estimator)
    h = np.zeros((2, 2))
    for i in range(0, len(x), size):
        if min(size, len(x) - i) < 4:
            continue
        xs, ys = x[i : i + size], y[i : i + size]
        grams = torch.from_numpy(np.stack([xs @ xs.T, ys @ ys.T]))
        f, _ = centred_rows(grams, estimator)
        centred = f.view(2, len(xs), len(xs))
        null.add(centred)
        h += _hsic_pairs(xs, ys, estimator)
    cka = h[0, 1] / np.sqrt(h[0, 0] * h[1, 1])
    return float(cka), float(null.summary(h + np.triu(h, 1).T)[0].p_value[0, 1])


def _hsic_pairs(x: np.ndarray, y: np.ndarray, estimator: str) -> np.ndarray:
    from tests.analysis.reference import hsic

    k, l = x @ x.T, y @ y.T  # noqa: E741
    return np.array([[hsic(k, k, estimator), hsic(k, l, estimator)], [0.0, hsic(l, l, estimator)]])


def _brute_terms(x: np.ndarray, y: np.ndarray, perms: np.ndarray, estimator: str) -> np.ndarray:
    """HSIC(K, P L Pᵀ) of linear Grams K = xxᵀ, L = yyᵀ for every row of ``perms``.

    Biased: ⟨HKH, P HLH Pᵀ⟩ = ‖x_cᵀ P y_c‖² (centred features). Unbiased: with U(L) = L + R − D
    (R_ij = −(r_i + r_j)/(n−2) + s/((n−1)(n−2)), r and s from L with a zero diagonal, D the
    diagonal that zeroes U(L)'s), ⟨U(K), P U(L) Pᵀ⟩ = ⟨K, P U(L) Pᵀ⟩ because U(K) − K is
    orthogonal to every U-centred matrix, which is ‖xᵀ P y‖² + the O(n) terms below.
    """
    n = len(x)
    if estimator == "biased":
        x, y = x - x.mean(0), y - y.mean(0)
    out = np.empty(len(perms))
    for c0 in range(0, len(perms), 1000):
        p = perms[c0 : c0 + 1000]
        yp = y[p].transpose(1, 0, 2).reshape(n, -1)  # (n, c·d_y): one product for the chunk
        cross = (x.T @ yp).reshape(x.shape[1], len(p), y.shape[1])
        out[c0 : c0 + 1000] = (cross**2).sum((0, 2))
    if estimator == "biased":
        return out / (n - 1) ** 2
    k, l = x @ x.T, y @ y.T  # noqa: E741
    lz = l - np.diag(np.diag(l))
    r, s = lz.sum(1), lz.sum()
    const = s / ((n - 1) * (n - 2))
    d = np.diag(l) - 2 * r / (n - 2) + const  # the diagonal of L + R, which U(L) zeroes
    out += -2 / (n - 2) * (r[perms] @ k.sum(1)) + const * k.sum() - d[perms] @ np.diag(k)
    return out / (n * (n - 3))


def _brute(x: np.ndarray, y: np.ndarray, size: int, estimator: str, seed: int) -> float:
    """Permutation p of the minibatch CKA: y shuffled within each batch, independently."""
    rng = np.random.default_rng(seed)
    null = np.zeros(PERMUTATIONS)
    h = np.zeros((2, 2))
    for i in range(0, len(x), size):
        xs, ys = x[i : i + size], y[i : i + size]
        if len(xs) < 4:
            continue
        perms = rng.permuted(np.tile(np.arange(len(xs)), (PERMUTATIONS, 1)), axis=1)
        null += _brute_terms(xs, ys, perms, estimator)
        h += _hsic_pairs(xs, ys, estimator)
    cka = h[0, 1] / np.sqrt(h[0, 0] * h[1, 1])
    null /= np.sqrt(h[0, 0] * h[1, 1])
    return float((1 + np.sum(null >= cka - 1e-12)) / (1 + PERMUTATIONS))


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_brute_terms_are_the_reference_hsic_of_permuted_grams(
    estimator: str, ref: types.SimpleNamespace
) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 2)) ** 3
    perms = np.stack([rng.permutation(12) for _ in range(5)])
    want = [ref.hsic(x @ x.T, (y @ y.T)[np.ix_(p, p)], estimator) for p in perms]
    np.testing.assert_allclose(_brute_terms(x, y, perms, estimator), want, rtol=1e-10)


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_moments_are_exact_over_every_permutation(
    n: int, estimator: str, ref: types.SimpleNamespace
) -> None:
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 3)) ** 3  # skewed, so every third-moment term matters
    y = rng.normal(size=(n, 2)) ** 3 + x[:, :2]
    k, l = x @ x.T, y @ y.T  # noqa: E741
    perms = np.array(list(itertools.permutations(range(n))))

    def statistic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Σ_ij a_ij b_π(i)π(j) over every permutation π, in the estimator's units."""
        t = (a[None] * b[perms[:, :, None], perms[:, None, :]]).sum((1, 2))
        return t / (n * (n - 3) if estimator == "unbiased" else (n - 1) ** 2)

    h = np.eye(n) - 1 / n
    if estimator == "biased":  # ⟨HKH, P HLH Pᵀ⟩ / (n-1)²
        values = statistic(h @ k @ h, h @ l @ h)
    else:  # ⟨Ã, P L̃ Pᵀ⟩ / (n(n-3)) with U-centred Grams
        values = statistic(_u_centred(k), _u_centred(l))
    want = [ref.hsic(k, l[np.ix_(p, p)], estimator) for p in perms[:50]]
    np.testing.assert_allclose(values[:50], want, rtol=1e-10, atol=1e-12 * np.abs(want).max())
    f, _ = centred_rows(torch.from_numpy(np.stack([k, l])), estimator)
    sums = batch_moments(layer_invariants(f.view(2, n, n), estimator).numpy(), n, estimator)
    mean, var, third, var_u, third_u, fourth_u = sums[:, 0, 1]
    scale = np.abs(values).max()
    assert mean == pytest.approx(values.mean(), abs=1e-12 * scale)
    assert var == pytest.approx(values.var(), rel=1e-9)
    assert third == pytest.approx(((values - values.mean()) ** 3).mean(), rel=1e-8)
    if estimator == "biased":  # the bias: tr(HKH) tr(HLH) / (n-1)³
        assert mean == pytest.approx(np.trace(h @ k @ h) * np.trace(h @ l @ h) / (n - 1) ** 3)
    # the U-statistic part (the whole null of the unbiased estimator): its cumulants to the
    # fourth, in the estimator's units
    t_u = statistic(_u_centred(k), _u_centred(l))
    assert abs(t_u.mean()) <= 1e-12 * np.abs(t_u).max()
    assert var_u == pytest.approx((t_u**2).mean(), rel=1e-9)
    assert third_u == pytest.approx((t_u**3).mean(), rel=1e-8)
    assert fourth_u == pytest.approx((t_u**4).mean() - 3 * (t_u**2).mean() ** 2, rel=1e-8)


def _u_centred(k: np.ndarray) -> np.ndarray:
    """Székely & Rizzo's U-centring, written out: zero diagonal and zero row sums."""
    n = len(k)
    z = k - np.diag(np.diag(k))
    r, s = z.sum(1), z.sum()
    u = z - r[:, None] / (n - 2) - r[None, :] / (n - 2) + s / ((n - 1) * (n - 2))
    return u - np.diag(np.diag(u))


def _features(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "independent":
        return rng.normal(size=(n, 5)), rng.normal(size=(n, 4))
    if kind == "low_rank":  # rank 2 on each side, one of them skewed: a skewed null
        z = rng.normal(size=(n, 2)) ** 3
        return z @ rng.normal(size=(2, 6)), rng.normal(size=(n, 2)) @ rng.normal(size=(2, 5))
    # weakly dependent: a faint shared signal under noise
    z = rng.normal(size=(n, 1))
    return np.hstack([z, rng.normal(size=(n, 4))]), np.hstack(
        [0.12 * z + rng.normal(size=(n, 1)), rng.normal(size=(n, 3))]
    )


def _check(p_analytic: float, p_perm: float) -> None:
    if p_perm >= 0.001:
        assert abs(p_analytic - p_perm) <= 0.005 + 0.1 * p_perm, (p_analytic, p_perm)


@pytest.mark.slow
@pytest.mark.parametrize("size", [16, 150])
@pytest.mark.parametrize("kind", ["independent", "low_rank", "weak"])
def test_analytic_p_matches_20000_permutations(kind: str, size: int) -> None:
    for seed in range(2):
        x, y = _features(kind, 150, seed)
        for estimator in ("unbiased", "biased"):
            _, p = _analytic(x, y, size, estimator)
            _check(p, _brute(x, y, size, estimator, seed))


@pytest.fixture(scope="module")
def zoo_layers() -> Callable[[int], tuple[np.ndarray, np.ndarray]]:
    """Two digits models trained for a few steps; a layer of each on 150 test images, the
    second read on images of which only the first ``matched`` are the first model's."""
    digits = load_digits("train")
    test = torch.as_tensor(load_digits("test").x).float()
    xs, ys = torch.as_tensor(digits.x).float(), torch.as_tensor(digits.y).long()
    readers = []
    for arch, layer in (("mixer_digits", "blocks.1"), ("mlp_digits", "pre_logits")):
        torch.manual_seed(0)
        net = models.create(arch)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
        for step in range(20):
            batch = slice(64 * step % 1200, 64 * step % 1200 + 64)
            loss = torch.nn.functional.cross_entropy(net(xs[batch]), ys[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        readers.append(LayerReader(net, [layer], "mean_tokens"))
    with torch.no_grad():
        a = readers[0](test[:150])[0].double().numpy()
        others = readers[1](test[:300])[0].double().numpy()

    def pair(matched: int) -> tuple[np.ndarray, np.ndarray]:
        return a, np.concatenate([others[:matched], others[150 + matched : 300]])

    return pair


@pytest.mark.slow
@pytest.mark.parametrize("size", [16, 150])
def test_analytic_p_matches_permutations_on_zoo_layers(
    size: int, zoo_layers: Callable[[int], tuple[np.ndarray, np.ndarray]]
) -> None:
    for matched in (0, 12):
        x, y = zoo_layers(matched)
        _, p = _analytic(x, y, size, "unbiased")
        _check(p, _brute(x, y, size, "unbiased", matched))


def test_p_values_of_independent_features_are_uniform() -> None:
    ps = []
    for seed in range(200):
        x, y = _features("low_rank" if seed % 2 else "independent", 40, 1000 + seed)
        ps.append(_analytic(x, y, 20, "unbiased")[1])
    assert stats.kstest(ps, "uniform").pvalue > 0.01


def test_q_values_are_benjamini_hochberg() -> None:
    p = np.random.default_rng(0).uniform(size=40) ** 3
    p[[3, 9]] = np.nan  # undefined cells are not tests
    q = q_values(p)
    kept = p[np.isfinite(p)]
    m = len(kept)
    # BH written out: q_i = min over p_j ≥ p_i of p_j · m / rank(p_j), capped at 1
    want = [min(min(pj * m / (np.sum(kept <= pj)), 1.0) for pj in kept if pj >= pi) for pi in kept]
    np.testing.assert_allclose(q[np.isfinite(p)], want, rtol=1e-12)
    assert np.isnan(q[[3, 9]]).all()
    assert (q[np.isfinite(p)] >= kept).all()
    order = np.argsort(kept)
    assert (np.diff(q[np.isfinite(p)][order]) >= 0).all()


def _tiny(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh(), torch.nn.Linear(12, 6)
    )


def test_compare_gives_the_analytic_null_by_default_and_shards_add_up() -> None:
    from analysis import combine, compare, compare_partial, shard_ranges

    nets = {"a": _tiny(0), "c": _tiny(1)}
    x = torch.randn(96, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    kw: dict[str, object] = {"layers": ["1", "3"], "batch_size": 32, "device": "cpu"}
    atlas = compare(nets, x, **kw)
    assert atlas.config["null"] == "analytic"
    p = atlas.p_values("a", "c")
    shuffled = compare(nets, x, permutations=4000, **kw).p_values("a", "c")
    assert p is not None and shuffled is not None
    close = np.abs(p - shuffled) <= 0.015 + 0.1 * shuffled  # 4,000 shuffles: ±0.008 at p = 0.5
    assert close[shuffled >= 0.001].all(), (p, shuffled)
    parts = [compare_partial(nets, x, batches=r, **kw) for r in shard_ranges(3, 2)]
    np.testing.assert_allclose(combine(parts).p_values("a", "c"), p, rtol=1e-9)


def test_the_biased_null_mean_is_its_bias(ref: types.SimpleNamespace) -> None:
    from analysis import cka_test

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(60, 3)), rng.normal(size=(60, 8))
    res = cka_test(x, y, estimator="biased", batch_size=20)
    # per batch: tr(HKH) tr(HLH) / (n-1)³, summed, over sqrt of the summed self-HSICs
    h = np.eye(20) - 1 / 20
    bias = xx = yy = 0.0
    for s in ref.batches(60, 20, "biased"):
        k, l = ref.gram(x[s], "linear"), ref.gram(y[s], "linear")  # noqa: E741
        bias += np.trace(h @ k @ h) * np.trace(h @ l @ h) / 19**3
        xx, yy = xx + ref.hsic(k, k, "biased"), yy + ref.hsic(l, l, "biased")
    assert res.method == "analytic" and res.null.size == 0
    assert res.null_mean == pytest.approx(bias / np.sqrt(xx * yy), rel=1e-9)
    assert res.null_mean > 0.05  # independent features, and yet a biased CKA well above 0
    assert res.null_q95 > res.null_mean


def test_the_gram_store_keeps_the_analytic_null_without_rereading_grams(tmp_path: Path) -> None:
    from analysis import DirectoryGramCache, compare

    nets = {"a": _tiny(0), "c": _tiny(1)}
    x = torch.randn(96, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    kw: dict[str, Any] = {"layers": ["1", "3"], "batch_size": 32, "device": "cpu"}
    plain = compare(nets, x, **kw).p_values("a", "c")
    grams_read: list[int] = []

    class Store(DirectoryGramCache):
        def get(self, key: str) -> np.ndarray | None:
            got = super().get(key)
            if got is not None and got.ndim == 3:  # a model's Grams, not a block or invariants
                grams_read.append(1)
            return got

    store = Store(str(tmp_path))
    keys = {"a": "ka", "c": "kc"}
    first = compare(nets, x, gram_cache=store, model_keys=keys, **kw)
    again = compare(nets, x, gram_cache=store, model_keys=keys, **kw)
    for atlas in (first, again):
        np.testing.assert_allclose(atlas.p_values("a", "c"), plain, rtol=1e-6)
    cache = again.diagnostics["gram_cache"]
    assert again.diagnostics["forward_passes"] == {"a": 0, "c": 0}
    assert cache["blocks_computed"] == 0 and cache["misses"] == 0
    assert not grams_read  # stored blocks and per-layer numbers: no Gram is read back
