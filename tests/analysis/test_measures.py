"""The whole-sample measures against independent float64 implementations written here.

The references follow the papers' own recipes, never the engine's basis-and-SVD route: CCA by
whitening the covariances with their inverse square roots (scipy.linalg.sqrtm), PWCCA per Morcos
et al. 2018 (weights from the canonical variates against the neurons), linear regression by
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
    alpha = np.abs(h.T @ _centre(x)).sum(axis=1)
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
        "pwcca": (_pwcca_side(hx, x, rho) + _pwcca_side(hy, y, rho)) / 2,
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
    assert got.degenerate is not None and not got.degenerate.any()
    assert got.ranks == [7, 5]


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
