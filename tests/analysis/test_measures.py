"""The whole-sample measures against independent float64 implementations written here.

The references follow the papers' own recipes, never the engine's basis-and-SVD route: CCA by
whitening the covariances with their inverse square roots (scipy.linalg.sqrtm), PWCCA as the
reference code of Morcos et al. 2018 computes it (google/svcca ``compute_pwcca``, written out in
:func:`_pwcca_reference_side`; its centred variant from the canonical variates against the
centred neurons), linear regression by
least squares (numpy.linalg.lstsq), Procrustes by the SVD of XᵀY, SVCCA by an SVD truncation
then CCA, and mutual k-NN by brute force.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from analysis import cka_from_features
from analysis.measures import WHOLE_SAMPLE, measure_matrices, projected
from analysis.measures.cca import pwcca_sides
from analysis.measures.factor import factorise

TOL = 1e-8


def _centre(x: np.ndarray) -> np.ndarray:
    return x - x.mean(axis=0)


def _inv_sqrt(c: np.ndarray) -> np.ndarray:
    return np.real(np.linalg.inv(scipy.linalg.sqrtm(c)))


def _cca(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Canonical correlations and the unit canonical variates of each side (full rank, n > d)."""
    x, y = _centre(x), _centre(y)
    wx, wy = _inv_sqrt(x.T @ x), _inv_sqrt(y.T @ y)
    u, rho, vt = np.linalg.svd(wx @ (x.T @ y) @ wy)
    c = min(x.shape[1], y.shape[1])
    hx, hy = x @ wx @ u[:, :c], y @ wy @ vt.T[:, :c]
    return rho[:c], hx / np.linalg.norm(hx, axis=0), hy / np.linalg.norm(hy, axis=0)


def _pwcca_side(h: np.ndarray, x: np.ndarray, rho: np.ndarray) -> float:
    """The centred variant: unit canonical variates against the centred neurons."""
    alpha = np.abs(h.T @ _centre(x)).sum(axis=1)
    return float((alpha / alpha.sum()) @ rho)


def _pwcca_reference_side(x: np.ndarray, y: np.ndarray) -> float:
    """PWCCA weighted on x's side as google/svcca's ``compute_pwcca(x.T, y.T)`` computes it
    (full rank, n > d), its SVD's signs fixed so that each coefficient vector's entry of largest
    magnitude is positive: the coefficient vectors uᵢ (columns of U from the SVD of
    Σxx^{-1/2} Σxy Σyy^{-1/2}, np.cov covariances) are applied to the centred neurons
    *without* whitening, each row gets its neuron's mean back (dirᵢ = uᵢᵀ(Xᵀ − μ) + μᵢ), the
    directions are orthonormalised by QR, and each is weighted by the sum of its absolute
    projections on the *uncentred* neurons."""
    d = x.shape[1]
    cov = np.cov(x.T, y.T)
    sxx, sxy, syy = cov[:d, :d], cov[:d, d:], cov[d:, d:]
    u, rho, _ = np.linalg.svd(_inv_sqrt(sxx) @ sxy @ _inv_sqrt(syy))
    c = min(x.shape[1], y.shape[1])
    u, rho = u[:, :c], rho[:c]
    u = u * np.sign(u[np.abs(u).argmax(axis=0), np.arange(c)])
    mu = x.mean(axis=0)
    directions = u.T @ (x - mu).T + mu[:c, None]  # (c, n)
    p, _ = np.linalg.qr(directions.T)
    alpha = np.abs(p.T @ x).sum(axis=1)
    return float((alpha / alpha.sum()) @ rho)


def _svd_reduce(x: np.ndarray, share: float = 0.99) -> np.ndarray:
    u, s, _ = np.linalg.svd(_centre(x), full_matrices=False)
    cum = np.cumsum(s**2) / np.sum(s**2)
    k = int(np.searchsorted(cum, share - 1e-12) + 1)
    return u[:, :k] * s[:k]


def _r2(x: np.ndarray, y: np.ndarray) -> float:
    """R² of y fitted from x by least squares (both centred)."""
    x, y = _centre(x), _centre(y)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(1 - np.sum((y - x @ coef) ** 2) / np.sum(y**2))


def _knn(x: np.ndarray, k: int) -> list[set[int]]:
    z = _centre(x)
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    out = []
    for i in range(len(z)):
        sims = [(float(z[i] @ z[j]), j) for j in range(len(z)) if j != i]
        out.append({j for _, j in sorted(sims, reverse=True)[:k]})
    return out


def reference(x: np.ndarray, y: np.ndarray, k: int = 10) -> dict[str, float]:
    rho, hx, hy = _cca(x, y)
    rx, ry = _svd_reduce(x), _svd_reduce(y)
    rho_sv = _cca(rx, ry)[0]
    xc, yc = _centre(x), _centre(y)
    nx, ny = _knn(x, k), _knn(y, k)
    return {
        "cca": float(np.mean(rho**2)),
        "cca_mean": float(np.mean(rho)),
        "svcca": float(np.mean(rho_sv**2)),
        "pwcca": (_pwcca_reference_side(x, y) + _pwcca_reference_side(y, x)) / 2,
        "pwcca_centred": (_pwcca_side(hx, x, rho) + _pwcca_side(hy, y, rho)) / 2,
        "linreg": (_r2(x, y) + _r2(y, x)) / 2,
        "procrustes": float(
            np.linalg.svd(xc.T @ yc, compute_uv=False).sum()
            / (np.linalg.norm(xc) * np.linalg.norm(yc))
        ),
        "mutual_knn": float(np.mean([len(a & b) / k for a, b in zip(nx, ny, strict=True)])),
    }


def _pair(seed: int, n: int = 60, dx: int = 7, dy: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dx)) @ rng.standard_normal((dx, dx)) + 3.0
    mix = rng.standard_normal((dx, dy))
    y = np.tanh(x @ mix) + 0.5 * rng.standard_normal((n, dy)) - 1.0  # related, not linearly
    return x, y


@pytest.mark.parametrize("route", ["projectors", "per pair", "fp32 features"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_measure_matches_its_independent_implementation(
    seed: int, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if route == "per pair":  # the R² measures from each pair's bases, as wide samples get them
        monkeypatch.setattr(projected, "PROJECTOR_BYTES", 0)
    x, y = _pair(seed)
    got = measure_matrices([torch.from_numpy(x), torch.from_numpy(y)], WHOLE_SAMPLE)
    if route == "fp32 features":  # factorised through their Grams; the reference reads the same
        x, y = x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)
        feats = [torch.from_numpy(x).float(), torch.from_numpy(y).float()]
        got = measure_matrices(feats, WHOLE_SAMPLE)
    want = reference(x, y)
    for name in WHOLE_SAMPLE:
        assert got.values[name][0, 1] == pytest.approx(want[name], abs=TOL), name
        assert got.values[name][1, 0] == got.values[name][0, 1]
    assert abs(want["pwcca"] - want["pwcca_centred"]) > 1e-3  # the two are told apart
    assert got.degenerate is not None and not got.degenerate.any()
    assert got.ranks == [7, 5]


def _relu_pair(seed: int, n: int, dx: int, dy: int) -> tuple[np.ndarray, np.ndarray]:
    """Two layers of ReLU units (positive means, as real activations have) sharing 6 factors."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 6))
    x = np.maximum(z @ rng.standard_normal((6, dx)) + 0.5 * rng.standard_normal((n, dx)) + 0.3, 0)
    y = np.maximum(z @ rng.standard_normal((6, dy)) + 0.8 * rng.standard_normal((n, dy)), 0)
    return x, y


@pytest.mark.parametrize(("dx", "dy"), [(12, 12), (8, 20), (20, 8)])
def test_pwcca_matches_the_reference_code_in_both_directions(dx: int, dy: int) -> None:
    x, y = _relu_pair(dx + dy, 300, dx, dy)
    fx, fy = (factorise(torch.from_numpy(v), loadings=True) for v in (x, y))
    x_side, y_side = pwcca_sides(fx, fy)
    assert x_side == pytest.approx(_pwcca_reference_side(x, y), abs=1e-6)
    assert y_side == pytest.approx(_pwcca_reference_side(y, x), abs=1e-6)
    assert abs(x_side - y_side) > 1e-3  # asymmetric: the measure is the mean of the two
    got = measure_matrices([torch.from_numpy(x), torch.from_numpy(y)], ["pwcca"])
    assert got.values["pwcca"][0, 1] == pytest.approx((x_side + y_side) / 2, abs=1e-12)
    rho, hx, hy = _cca(x, y)
    centred = pwcca_sides(fx, fy, centred=True)
    assert centred[0] == pytest.approx(_pwcca_side(hx, x, rho), abs=1e-6)
    assert centred[1] == pytest.approx(_pwcca_side(hy, y, rho), abs=1e-6)


def test_pwcca_moves_with_a_neurons_offset_where_the_centred_variant_does_not() -> None:
    x, y = _relu_pair(3, 200, 10, 10)
    shifted = x.copy()
    shifted[:, 0] += 5.0  # the same layer up to a constant on one neuron
    sides = [pwcca_sides(*(factorise(torch.from_numpy(v), loadings=True) for v in (a, y)),
                         centred=c) for a in (x, shifted) for c in (False, True)]  # fmt: skip
    assert abs(sides[0][0] - sides[2][0]) > 1e-3
    assert sides[1][0] == pytest.approx(sides[3][0], abs=1e-9)


def test_svcca_truncates_a_low_variance_direction() -> None:
    # one direction with a tiny share of the variance: SVCCA drops it, CCA keeps it
    x, y = _pair(2, dx=6, dy=6)
    x[:, 0] *= 1e-3
    y[:, 0] = x[:, 0] + 1e-6 * np.random.default_rng(3).standard_normal(len(x))
    got = measure_matrices([torch.from_numpy(x), torch.from_numpy(y)], ["cca", "svcca"])
    want = reference(x, y)
    assert got.values["svcca"][0, 1] == pytest.approx(want["svcca"], abs=TOL)
    assert got.values["svcca"][0, 1] != pytest.approx(got.values["cca"][0, 1], abs=1e-3)


def test_identical_features_give_one() -> None:
    x, _ = _pair(4)
    got = measure_matrices([torch.from_numpy(x)] * 2, WHOLE_SAMPLE)
    for name in WHOLE_SAMPLE:
        assert got.values[name] == pytest.approx(np.ones((2, 2)), abs=TOL), name


def test_an_orthogonal_transform_keeps_procrustes_and_cka_at_one() -> None:
    x, _ = _pair(5)
    rot = np.linalg.qr(np.random.default_rng(6).standard_normal((7, 7)))[0]
    y = x @ rot
    got = measure_matrices([torch.from_numpy(x), torch.from_numpy(y)], ["procrustes"])
    assert got.values["procrustes"][0, 1] == pytest.approx(1.0, abs=TOL)
    cka = cka_from_features([x], [y], estimator="biased")
    assert cka[0, 0] == pytest.approx(1.0, abs=TOL)


def test_independent_noise_has_r2_cca_near_zero_when_n_far_exceeds_d() -> None:
    rng = np.random.default_rng(7)
    n, d = 20_000, 4
    x, y = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    got = measure_matrices([torch.from_numpy(x), torch.from_numpy(y)], ["cca", "linreg"])
    # each squared canonical correlation of independent samples is about 1 / n
    assert got.values["cca"][0, 1] < 20 * d / n
    assert got.values["linreg"][0, 1] < 20 * d / n


def test_d_at_least_n_is_reported_degenerate_not_regularised() -> None:
    rng = np.random.default_rng(8)
    n = 12
    wide, other = rng.standard_normal((n, 30)), rng.standard_normal((n, 3))
    feats = [torch.from_numpy(wide), torch.from_numpy(other)]
    got = measure_matrices(feats, ["cca", "cca_mean", "procrustes"])
    assert got.ranks == [n - 1, 3]
    assert got.degenerate is not None
    assert got.degenerate[0, 1] and got.degenerate[1, 0] and not got.degenerate[1, 1]
    # the wide side spans every centred direction: each canonical correlation is 1
    assert got.values["cca"][0, 1] == pytest.approx(1.0, abs=TOL)
    assert got.values["cca_mean"][0, 1] == pytest.approx(1.0, abs=TOL)
    assert got.values["procrustes"][0, 1] < 1


def test_fp32_features_drop_rounding_directions_from_the_rank() -> None:
    rng = np.random.default_rng(9)
    low = rng.standard_normal((50, 3)) @ rng.standard_normal((3, 8))  # rank 3 in 8 columns
    got = measure_matrices([torch.from_numpy(low).float()], ["cca"])
    assert got.ranks == [3]
