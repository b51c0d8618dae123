"""Paired image terms of the verdicts, on constructed projections with a known shared image effect.

A cell and its baselines are computed over the same N images, so each is, to first order, a sum
over those images of its projection φ. Here the projections are built: ``φ_T = g + e_T``,
``φ_C = g + e_C`` for the seed ceiling and ``φ_U_k = g + e_k`` for k untrained draws, with g
(the image effect every side shares) and the e's mutually orthogonal, centred, of squared
norms ``G`` and ``E``. Then ``Σ φ_T² = G + E`` (the cell's own image variance, ``se²``), the
summed seed term is ``2 (G + E)`` and the paired one ``Σ (e_T − e_C)² = 2E``: smaller by
``E / (G + E)``; the paired learned term is ``Σ (e_T − ē)² = E (1 + 1/k)`` against the summed
``G + E``.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.comparison.baselines import paired_image_var
from analysis.estimators.hsic import centred_rows, hsic_block
from analysis.inference.image_intervals import ImageMoments, image_intervals, sample_terms
from analysis.inference.paired_images import (
    DiagonalCells,
    cell_projections,
    diagonal_terms,
    pair_projections,
)
from analysis.inference.verdicts import cell_verdicts, verdict_images

Z = 1.959963984540054
N, DRAWS = 200, 3
E = (0.015 / Z) ** 2 / 2  # the paired seed interval's half-width is 0.015
G = 20 * E  # the shared image effect: 20 times each side's own


def _orthogonal(count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` centred, mutually orthogonal unit vectors over N images (columns)."""
    a = rng.standard_normal((N, count))
    q, _ = np.linalg.qr(a - a.mean(axis=0))
    return q


def _cells(phi: np.ndarray) -> np.ndarray:
    """One cell's per-image projections as the (N, 2, 2) of a two-layer atlas."""
    out = np.full((N, 2, 2), np.nan)
    out[:, 0, 1] = out[:, 1, 0] = phi
    return out


def _matrix(value: float) -> np.ndarray:
    out = np.full((2, 2), value)
    np.fill_diagonal(out, np.nan)
    return out


def _constructed() -> dict[str, np.ndarray]:
    basis = _orthogonal(3 + DRAWS, np.random.default_rng(0))
    g, e_t, e_c = (np.sqrt(G) * basis[:, 0], np.sqrt(E) * basis[:, 1], np.sqrt(E) * basis[:, 2])
    draws = [g + np.sqrt(E) * basis[:, 3 + k] for k in range(DRAWS)]
    return {"cell": g + e_t, "ceiling": g + e_c, "twins": np.stack(draws)}


def test_paired_terms_are_smaller_by_the_shared_part() -> None:
    phi = _constructed()
    cell = _cells(phi["cell"])
    seed = np.asarray(paired_image_var(cell, _cells(phi["ceiling"])), dtype=float)
    twins = np.mean([_cells(t) for t in phi["twins"]], axis=0)
    floor = np.asarray(paired_image_var(cell, twins), dtype=float)
    se2 = np.sum(phi["cell"] ** 2)
    np.testing.assert_allclose(se2, G + E, rtol=1e-12)
    np.testing.assert_allclose(seed[0, 1], 2 * E, rtol=1e-12)
    np.testing.assert_allclose(seed[0, 1] / (2 * se2), E / (G + E), rtol=1e-12)
    np.testing.assert_allclose(floor[0, 1], E * (1 + 1 / DRAWS), rtol=1e-12)
    assert seed[0, 0] is None or np.isnan(seed[0, 0])  # undefined cells stay undefined


def test_paired_seed_verdict_decides_where_the_sum_cannot() -> None:
    phi = _constructed()
    value, gap = 0.6, -0.005
    se = np.sqrt(np.sum(phi["cell"] ** 2))
    low, high = _matrix(value - Z * se), _matrix(value + Z * se)
    ceiling = _matrix(value - gap)
    seed_ceiling = (ceiling, ceiling - Z * se, ceiling + Z * se)  # the ceiling's own, G + E
    paired_var = np.asarray(
        paired_image_var(_cells(phi["cell"]), _cells(phi["ceiling"])), dtype=float
    )
    paired = cell_verdicts(
        _matrix(value), low, high, seed_ceiling=seed_ceiling, seed_images=paired_var
    )
    summed = cell_verdicts(_matrix(value), low, high, seed_ceiling=seed_ceiling)
    half_paired, half_summed = Z * np.sqrt(2 * E), Z * np.sqrt(2 * (G + E))
    np.testing.assert_allclose(paired["seed_gap_high"][0, 1], gap + half_paired, rtol=1e-9)
    np.testing.assert_allclose(summed["seed_gap_high"][0, 1], gap + half_summed, rtol=1e-9)
    # paired: [-0.020, 0.010], level within the margin; summed: [-0.074, 0.064], too wide
    assert paired["seed_verdict"][0, 1] == "within_seed_spread"
    assert summed["seed_verdict"][0, 1] == "undecided"
    assert verdict_images(paired, None, paired_var) == {"seed": "paired"}
    assert verdict_images(summed, None, None) == {"seed": "summed"}


def test_paired_learned_verdict_decides_where_the_sum_cannot() -> None:
    phi = _constructed()
    value, sd, learned = 0.5, 0.01, 0.03
    se = np.sqrt(np.sum(phi["cell"] ** 2))
    low, high = _matrix(value - Z * se), _matrix(value + Z * se)
    twins = np.mean([_cells(t) for t in phi["twins"]], axis=0)
    paired_var = np.asarray(paired_image_var(_cells(phi["cell"]), twins), dtype=float)
    floor = (_matrix(value - learned), _matrix(sd), DRAWS)
    paired = cell_verdicts(_matrix(value), low, high, random_init=floor, learned_images=paired_var)
    summed = cell_verdicts(_matrix(value), low, high, random_init=floor)
    from scipy import stats

    between = sd**2 / DRAWS
    for out, image in ((paired, E * (1 + 1 / DRAWS)), (summed, G + E)):
        v = image + between
        reach = stats.t.ppf(0.975, v**2 * (DRAWS - 1) / between**2) * np.sqrt(v)
        np.testing.assert_allclose(out["learned_low"][0, 1], learned - reach, rtol=1e-9)
    assert paired["learned_verdict"][0, 1] == "above_untrained"
    assert summed["learned_verdict"][0, 1] == "undecided"


def test_cell_projections_square_to_the_image_intervals_and_match_the_pairs() -> None:
    # the full-cell projections against two routes already validated: the image interval's
    # moments and the diagonal pairs' projections (whose coverage test_paired_images simulates)
    rng = np.random.default_rng(3)
    x, e1, e2 = rng.standard_normal((3, 120, 3))
    layers = [torch.from_numpy(f) for f in (x, x + 0.7 * e1, x + 0.5 * (0.6 * e1 + 0.8 * e2))]
    moments = ImageMoments(3, torch.device("cpu"))
    cells = DiagonalCells([1, 1, 1], [(0, 1), (0, 2), (1, 2)])
    hsic, psi, psi_cells, psi_self = np.zeros((3, 3)), [], [], []
    for start in range(0, 120, 40):
        grams = torch.stack([f[start : start + 40] @ f[start : start + 40].T for f in layers])
        rows = centred_rows(grams, "unbiased")
        hsic += hsic_block(rows, rows, "unbiased").numpy()
        moments.add(rows, "unbiased")
        psi.append((sample_terms(rows, "unbiased") * np.sqrt(40 / 39)).numpy())
        got = diagonal_terms(rows, "unbiased", cells.x, cells.y)
        psi_cells.append(got[0])
        psi_self.append(got[1])
    phi = cell_projections(hsic, np.concatenate(psi))
    low, high = image_intervals(hsic, moments.state())
    upper = np.triu_indices(3, 1)
    np.testing.assert_allclose(
        np.sqrt(np.sum(phi**2, axis=0))[upper], ((high - low) / (2 * Z))[upper], rtol=1e-9
    )
    pairs = pair_projections(hsic, cells, np.concatenate(psi_cells), np.concatenate(psi_self))
    np.testing.assert_allclose(phi[:, [0, 0, 1], [1, 2, 2]], pairs, rtol=1e-9, atol=1e-15)
