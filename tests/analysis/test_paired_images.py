"""Paired image variance of a difference of two CKA values over the same images, by simulation.

The model: a reference layer X (n × d standard normal images) and two layers of other networks,
``Y_A = X + σ_A E₁`` and ``Y_B = X + σ_B (c E₁ + √(1 − c²) E₂)`` (E independent standard
normal): both see the same images through X, and their noise shares a part ``c``. With linear
kernels the population CKA of X with ``X + σ E`` is ``d / √(d · d (1 + σ²)²) = 1 / (1 + σ²)``,
whatever the correlation of the noises, so the difference's true value is
``Δ = 1/(1 + σ_A²) − 1/(1 + σ_B²)``. Each simulated study computes both cells over the same
images in batches (the unbiased estimator), their per-image projections
(:mod:`analysis.inference.paired_images`) and the 95 % Wald interval ``Δ̂ ± 1.96 √v`` with
``v = Σ_a (φ_a − φ'_a)²``; the unpaired interval uses ``Σ φ_a² + Σ φ'_a²``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import analysis
import models
from analysis.batch_statistics import pair_image_terms
from analysis.estimators.hsic import centred_rows, hsic_block
from analysis.inference.image_intervals import ImageMoments, image_intervals
from analysis.inference.paired_images import (
    DiagonalCells,
    diagonal_terms,
    pair_projections,
    paired_variance,
    unpaired_variance,
)

Z = 1.959963984540054
N_IMAGES, BATCH, D = 160, 40, 4
STUDIES, CHUNK = 1000, 250  # simulated studies, and how many run side by side


def _population_cka(sigma: float) -> float:
    return 1.0 / (1.0 + sigma**2)


def _unbiased_hsic(f: torch.Tensor, r: torch.Tensor, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Song et al.'s unbiased HSIC of layers x[k], y[k] from doubly centred, diagonal-zeroed
    Grams (rows F) and their row sums R: (F_x·F_y + s_x s_y/((n−1)(n−2)) − 2 R_x·R_y/(n−2))
    / (n(n−3))."""
    n = r.shape[1]
    s = r.sum(1)
    dot = (
        (f[x] * f[y]).sum(1)
        + s[x] * s[y] / ((n - 1) * (n - 2))
        - 2 / (n - 2) * (r[x] * r[y]).sum(1)
    )
    return (dot / (n * (n - 3))).numpy()


def _studies(
    rng: np.random.Generator, count: int, sigma_a: float, sigma_b: float, shared: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(CKA of X with Y_A, with Y_B (count, 2); the two cells' per-image projections (N, count)
    each) of ``count`` simulated studies, run side by side as 3·count one-layer models."""
    x = rng.standard_normal((count, N_IMAGES, D))
    e1, e2 = rng.standard_normal((2, count, N_IMAGES, D))
    ya = x + sigma_a * e1
    yb = x + sigma_b * (shared * e1 + np.sqrt(1 - shared**2) * e2)
    layers = torch.from_numpy(np.stack([x, ya, yb], axis=1).reshape(3 * count, N_IMAGES, D))
    study = range(count)
    cells = DiagonalCells([1] * 3 * count, [(3 * i, 3 * i + k) for i in study for k in (1, 2)])
    own = np.arange(3 * count)
    hsic = np.zeros((3 * count, 3 * count))
    psi_cells, psi_self = [], []
    for start in range(0, N_IMAGES, BATCH):
        feats = layers[:, start : start + BATCH]
        rows = centred_rows(feats @ feats.transpose(1, 2), "unbiased")
        hsic[cells.x, cells.y] += _unbiased_hsic(*rows, cells.x, cells.y)
        hsic[own, own] += _unbiased_hsic(*rows, own, own)
        got = diagonal_terms(rows, "unbiased", cells.x, cells.y)
        psi_cells.append(got[0])
        psi_self.append(got[1])
    terms = pair_projections(hsic, cells, np.concatenate(psi_cells), np.concatenate(psi_self))
    d = np.diag(hsic)
    cka = (hsic[cells.x, cells.y] / np.sqrt(d[cells.x] * d[cells.y])).reshape(count, 2)
    return cka, terms[:, 0::2], terms[:, 1::2]


def _simulate(sigma_a: float, sigma_b: float, shared: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    parts = [_studies(rng, CHUNK, sigma_a, sigma_b, shared) for _ in range(STUDIES // CHUNK)]
    cka = np.concatenate([p[0] for p in parts])
    phi_a = np.concatenate([p[1] for p in parts], axis=1).T
    phi_b = np.concatenate([p[2] for p in parts], axis=1).T
    return {
        "a": cka[:, 0],
        "b": cka[:, 1],
        "est": cka[:, 0] - cka[:, 1],
        "paired": np.array([paired_variance(u, v) for u, v in zip(phi_a, phi_b, strict=True)]),
        "unpaired": np.array([unpaired_variance(u, v) for u, v in zip(phi_a, phi_b, strict=True)]),
    }


@pytest.fixture(scope="module")
def apart() -> dict[str, np.ndarray]:
    return _simulate(0.8, 1.0, 0.5, seed=1)


@pytest.fixture(scope="module")
def level() -> dict[str, np.ndarray]:
    return _simulate(0.9, 0.9, 0.5, seed=2)


def test_paired_interval_covers_the_true_difference_95_percent(
    apart: dict[str, np.ndarray],
) -> None:
    delta = _population_cka(0.8) - _population_cka(1.0)
    half = Z * np.sqrt(apart["paired"])
    covered = np.mean(np.abs(apart["est"] - delta) <= half)
    assert 0.93 <= covered <= 0.97, covered


def test_paired_interval_decides_no_difference_at_most_5_percent(
    level: dict[str, np.ndarray],
) -> None:
    assert _population_cka(0.9) - _population_cka(0.9) == 0.0
    rejected = np.mean(np.abs(level["est"]) > Z * np.sqrt(level["paired"]))
    assert rejected <= 0.05, rejected


def test_paired_interval_is_narrower_by_the_shared_part(apart: dict[str, np.ndarray]) -> None:
    # the factor the shared part predicts, from the spread over the simulated studies:
    # sd(Δ̂) against √(Var ρ̂_A + Var ρ̂_B), the spread the two cells would have if independent
    predicted = np.std(apart["est"]) / np.sqrt(np.var(apart["a"]) + np.var(apart["b"]))
    got = np.sqrt(np.mean(apart["paired"]) / np.mean(apart["unpaired"]))
    assert predicted < 0.8  # the two cells do share most of their image noise here
    assert got == pytest.approx(predicted, rel=0.1)
    # the unpaired interval, too wide, covers nearly always
    delta = _population_cka(0.8) - _population_cka(1.0)
    assert np.mean(np.abs(apart["est"] - delta) <= Z * np.sqrt(apart["unpaired"])) > 0.99


def test_a_cell_projection_squares_to_its_image_interval() -> None:
    rng = np.random.default_rng(3)
    x, e = rng.standard_normal((2, 120, 3))
    layers = [torch.from_numpy(f) for f in (x, x + 0.7 * e)]
    moments = ImageMoments(2, torch.device("cpu"))
    cells = DiagonalCells([1, 1], [(0, 1)])
    hsic, psi_cells, psi_self = np.zeros((2, 2)), [], []
    for start in range(0, 120, 40):
        grams = torch.stack([f[start : start + 40] @ f[start : start + 40].T for f in layers])
        rows = centred_rows(grams, "unbiased")
        hsic += hsic_block(rows, rows, "unbiased").numpy()
        moments.add(rows, "unbiased")
        got = diagonal_terms(rows, "unbiased", cells.x, cells.y)
        psi_cells.append(got[0])
        psi_self.append(got[1])
    terms = pair_projections(hsic, cells, np.concatenate(psi_cells), np.concatenate(psi_self))
    low, high = image_intervals(hsic, moments.state())
    np.testing.assert_allclose(np.sqrt(np.sum(terms[:, 0] ** 2)), (high - low)[0, 1] / (2 * Z))


def test_compare_keeps_each_pairs_image_terms_and_writes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nets = {f"s{i}": models.create("mlp_digits", seed=i) for i in range(3)}
    x = torch.randn(96, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    one = analysis.compare(nets, x, batch_size=32, device="cpu", interval="images", layers="stem")
    terms = one.image_terms("s0", "s1")
    assert terms is not None and terms.shape == (96,)
    bounds = one.interval("s0", "s1")
    assert bounds is not None
    low, high = bounds
    # one layer each: the pair's terms are its one cell's, which square to its interval
    np.testing.assert_allclose(np.sqrt(np.sum(terms**2)), (high - low)[0, 0] / (2 * Z), rtol=1e-9)
    back = analysis.Atlas.from_dict(one.to_dict())
    again = back.image_terms("s1", "s0")
    assert again is not None
    np.testing.assert_allclose(again, terms, rtol=1e-6)
    assert one.image_terms("s0", "s0") is None
    # every layer: the mean's sd is at most the mean of the cells' sds (Cauchy–Schwarz)
    every = analysis.compare(nets, x, batch_size=32, device="cpu", interval="images")
    bounds = every.interval("s0", "s2")
    assert bounds is not None
    low, high = bounds
    mean_se = float(np.mean(np.diagonal(high - low))) / (2 * Z)
    pair = every.image_terms("s0", "s2")
    assert pair is not None and 0 < np.sqrt(np.sum(pair**2)) <= mean_se
    plain = analysis.compare(nets, x, batch_size=32, device="cpu", interval="none")
    assert plain.image_terms("s0", "s1") is None and "image_terms" not in plain.to_dict()
    # past the cap (3 pairs × 96 images > 200): none kept, the differences will sum
    monkeypatch.setattr(pair_image_terms, "MAX_TERMS", 200)
    capped = analysis.compare(nets, x, batch_size=32, device="cpu", interval="images")
    assert capped.image_terms("s0", "s1") is None and capped.interval("s0", "s1") is not None
