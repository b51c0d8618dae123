"""Estimators and kernels against the independent float64 reference in ``_reference``."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from analysis import EstimatorError, cka_from_features

KERNELS = ["linear", "rbf"]
ESTIMATORS = ["biased", "unbiased"]


def features(seed: int, n: int, dims: list[int], offset: float = 0.0) -> list[np.ndarray]:
    """Correlated layers: shared latent factors plus noise, with a common offset."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 8))
    out = []
    for d in dims:
        w = rng.normal(size=(8, d))
        out.append((np.tanh(z @ w) + 0.5 * rng.normal(size=(n, d)) + offset).astype(np.float32))
    return out


@pytest.mark.parametrize("mode", ["full", "minibatch"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_matches_reference(
    kernel: str, estimator: str, mode: str, ref: types.SimpleNamespace
) -> None:
    # d=12 < n takes the feature-space identity in full linear mode; d=150 > n the Gram path.
    xs = features(0, 110, [12, 150], offset=3.0)
    ys = features(1, 110, [7, 90])
    bs = 40  # batches of 40, 40 and a ragged 30
    got = cka_from_features(xs, ys, kernel=kernel, estimator=estimator, mode=mode, batch_size=bs)
    want = ref.cka_matrix(
        xs, ys, kernel=kernel, estimator=estimator, batch_size=bs if mode == "minibatch" else None
    )
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_rbf_bandwidth_multiplier(ref: types.SimpleNamespace) -> None:
    xs, ys = features(2, 60, [10]), features(3, 60, [20])
    got = cka_from_features(xs, ys, kernel="rbf:0.5", estimator="biased")
    want = ref.cka_matrix(xs, ys, kernel="rbf", estimator="biased", t=0.5)
    np.testing.assert_allclose(got, want, atol=1e-9)
    with pytest.raises(EstimatorError):
        cka_from_features(xs, ys, kernel="rbf:-1")
    with pytest.raises(EstimatorError):
        cka_from_features(xs, ys, kernel="cosine")


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_minibatch_with_one_batch_equals_full(kernel: str, estimator: str) -> None:
    xs, ys = features(4, 64, [8, 100]), features(5, 64, [30])
    full = cka_from_features(xs, ys, kernel=kernel, estimator=estimator, mode="full")
    mini = cka_from_features(
        xs, ys, kernel=kernel, estimator=estimator, mode="minibatch", batch_size=64
    )
    np.testing.assert_allclose(mini, full, atol=1e-6)


@pytest.mark.parametrize("mode", ["full", "minibatch"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_invariances(kernel: str, estimator: str, mode: str) -> None:
    x, y = (f.astype(np.float64) for f in features(6, 96, [24, 16]))
    q, _ = np.linalg.qr(np.random.default_rng(7).normal(size=(24, 24)))
    kw = {"kernel": kernel, "estimator": estimator, "mode": mode, "batch_size": 32}
    base = cka_from_features([x], [y], **kw)[0, 0]
    assert cka_from_features([x @ q], [y], **kw)[0, 0] == pytest.approx(base, abs=1e-9)
    assert cka_from_features([3.7 * x], [y], **kw)[0, 0] == pytest.approx(base, abs=1e-9)
    assert cka_from_features([x], [x], **kw)[0, 0] == pytest.approx(1.0, abs=1e-12)
    assert cka_from_features([y], [x], **kw)[0, 0] == pytest.approx(base, abs=1e-12)


def test_symmetry_is_exact() -> None:
    xs, ys = features(8, 80, [10, 40]), features(9, 80, [25, 5])
    ab = cka_from_features(xs, ys, mode="minibatch", batch_size=32)
    ba = cka_from_features(ys, xs, mode="minibatch", batch_size=32)
    np.testing.assert_array_equal(ab, ba.T)


@pytest.mark.parametrize("mode", ["full", "minibatch"])
def test_feature_permutation_leaves_linear_cka_unchanged(mode: str) -> None:
    x, y = features(10, 90, [60, 30])
    perm = np.random.default_rng(11).permutation(60)
    kw = {"mode": mode, "batch_size": 30}
    a = cka_from_features([x], [y], **kw)
    b = cka_from_features([x[:, perm]], [y], **kw)
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("mode", ["full", "minibatch"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_constant_layer_is_undefined_not_nan_from_noise(kernel: str, mode: str) -> None:
    (x,) = features(12, 64, [20])
    const = np.full((64, 300), 0.3173, dtype=np.float32)
    got = cka_from_features([x, const], [x], kernel=kernel, mode=mode, batch_size=32)
    assert got[0, 0] == pytest.approx(1.0, abs=1e-6)
    assert np.isnan(got[1, 0])


def test_unbiased_cka_can_be_negative_and_is_not_clamped() -> None:
    rng = np.random.default_rng(13)
    x, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 3))
    values = [cka_from_features([x[:, [i]]], [y[:, [j]]])[0, 0] for i in range(3) for j in range(3)]
    assert min(values) < 0


def test_accepts_tensors_and_rejects_mismatched_samples() -> None:
    x, y = features(14, 40, [5, 6])
    a = cka_from_features([torch.from_numpy(x)], [y])
    b = cka_from_features([x], [torch.from_numpy(y)])
    np.testing.assert_array_equal(a, b)
    with pytest.raises(EstimatorError):
        cka_from_features([x], [y[:30]])
    with pytest.raises(EstimatorError):
        cka_from_features([x], [y], estimator="weird")
    with pytest.raises(EstimatorError):
        cka_from_features([x], [y], mode="minibatch", batch_size=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_rbf_kernel_is_finite_across_its_bandwidth_range(dtype: torch.dtype, scale: float) -> None:
    """At both ends of the accepted multipliers, for features small and large, the Gram is
    finite with a unit diagonal (analysis.estimators.kernels: why t is bounded); rbf:1e-30
    made the diagonal 0/0 in float32."""
    from analysis.estimators.kernels import RBF_T_MAX, RBF_T_MIN, Kernel, gram

    x = torch.from_numpy(features(7, 48, [300])[0]).to(dtype) * scale
    for t in (RBF_T_MIN, RBF_T_MAX):
        k = gram(x, Kernel("rbf", t))
        assert torch.isfinite(k).all() and torch.equal(k.diagonal(), torch.ones(48, dtype=dtype))
        off = k[~torch.eye(48, dtype=torch.bool)]
        assert (off > 0).any() and (off < 1).all()  # neither the identity nor all ones
