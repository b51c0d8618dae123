"""Permutations drawn for the cells whose analytic null does not hold in the tail.

:mod:`analysis.inference.null_moments` fits a Pearson type III to the first three exact moments of
the within-batch permutation null, and checks the fit against the exact fourth. Where the check
fails, the cell's p-value comes from the null itself: within every batch the samples of one
side are shuffled, and the minibatch statistic is recomputed (:func:`monte_carlo_p`). This
module keeps what that needs and draws the permutations.

**What is kept** (:class:`KeptCentred`). The statistic of a shuffled batch is
``T(π) = Σ_ij A_ij B_π(i)π(j)`` with A, B the batch's centred Grams: the U-centred ones for the
unbiased estimator (U-centring commutes with permuting samples), HKH for the biased one. So a
run keeps, for every layer and batch, the upper triangle of that matrix (and its diagonal, for
the biased estimator) in float32: ``n(n-1)/2`` numbers per layer and batch of n, nothing per
cell; or, for a linear kernel and a layer narrower than half the batch, its features
(n·d numbers), whose draws cost O(n d d') instead of O(n²) (:func:`_statistics`). The run
decides up front whether the whole plan's matrices fit :data:`KEEP_BYTES`; if
they do not (or a plan of unknown length outgrows it), nothing is kept and flagged cells keep
the fitted p (the atlas says so). The state is named arrays, and two states (ranges of one
plan, see :mod:`analysis.shards.shard`) add by naming the blocks of both.

**Sequential Monte Carlo p** (Besag & Clifford 1991). Each cell draws its permutations from
its own random stream (the run's seed and the cell), in rounds of growing size, and stops at
the :data:`EXCEEDANCES`-th draw whose null CKA reaches the observed one: after L draws,
``p = h / L``. A cell that never gets there stops at :data:`MAX_DRAWS` with
``p = (G + 1) / (MAX_DRAWS + 1)`` (G exceedances). Both are valid p-values:
``P(p ≤ α) ≤ α`` under the null. A clearly non-significant cell stops after a few dozen draws
(p = 0.5 takes about 20).

**A clearly huge effect** needs no draws: the exact variance (and for the unbiased estimator
the exact fourth cumulant) bound the tail whatever the distribution (:func:`moment_bound`:
Cantelli's inequality, and Cantelli's inequality for (X - μ)²). Where that bound is already
below the smallest Monte Carlo p, 1 / (MAX_DRAWS + 1), the cell reports the bound.

**Cost.** Per draw and batch one gather of the shuffled n×n matrix and a dot with the other
(``np.take`` by rows, then by columns of the unshuffled side: 46 µs at n = 150 on one
core), or with narrow features a gather of n×d' and an n×d×d' product; per cell about
h/p draws (p ≥ h/N), at most N.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from analysis.inference.null_moments import u_centre
from analysis.inference.permutation_null import TIE_TOLERANCE

__all__ = [
    "EXCEEDANCES",
    "KEEP_BYTES",
    "MAX_DRAWS",
    "KeptCentred",
    "complete_layers",
    "join_kept",
    "kept_bytes",
    "moment_bound",
    "monte_carlo_p",
]

# The most the kept matrices of a run may take (the whole plan's, on the host).
KEEP_BYTES = 256 * 2**20
# Besag & Clifford's h: stop at the h-th draw that reaches the observed statistic.
EXCEEDANCES = 10
# The most draws per cell: the smallest Monte Carlo p is 1 / (MAX_DRAWS + 1).
MAX_DRAWS = 999
# The first round's draws; each next round doubles.
_FIRST_ROUND = 16
# Draws × n² values gathered at once for one cell and batch (float32).
_CHUNK_VALUES = 2**22
# A random stream of its own (the bootstrap and the permutation null use the same seed).
_STREAM = 0x7A11_D2A5


def _entry_size(n: int, estimator: str) -> int:
    return n * (n - 1) // 2 + (n if estimator == "biased" else 0)


def kept_bytes(layers: int, batches: int, n: int, estimator: str) -> int:
    """The most that keeping ``layers`` layers over ``batches`` batches of ``n`` takes."""
    return 4 * layers * batches * _entry_size(n, estimator)


class KeptCentred:
    """Every layer's centred Gram of every batch of a run, on the host in float32: the upper
    triangle (and the diagonal, biased), or for a linear kernel whose features are narrower
    than half the batch, the features themselves (n × d numbers, and the draws take
    O(n d d') instead of O(n²)). Each batch's arrays are kept as they are, never joined: the
    state names them, and two states add by naming both.

    ``budget``: the most bytes it takes; past it, everything is dropped and the state says
    ``overflow`` (no cell of the run can draw permutations then).
    """

    def __init__(self, estimator: str, budget: int = KEEP_BYTES) -> None:
        self.estimator, self.budget = estimator, budget
        self.grams: list[tuple[int, int, np.ndarray]] = []  # (batch, first layer, (L, m))
        self.features: list[tuple[int, int, np.ndarray]] = []  # (batch, layer, (n, d))
        self.narrow: set[tuple[int, int]] = set()  # (batch, layer) kept as features
        self.bytes, self.overflow = 0, False

    def _room(self, size: int) -> bool:
        if self.overflow or self.bytes + size > self.budget:
            self.grams, self.features, self.narrow = [], [], set()
            self.bytes, self.overflow = 0, True
        else:
            self.bytes += size
        return not self.overflow

    def add_features(self, batch: int, layer: int, features: torch.Tensor) -> bool:
        """Keep layer ``layer``'s features (n, …) of batch ``batch`` instead of its Gram, where
        its kernel is linear (the caller knows) and d < (n - 1)/2; False where it did not."""
        n = features.shape[0]
        d = features.numel() // max(n, 1)
        if 2 * d >= n - 1 or not self._room(4 * n * d):
            return False
        flat = features.detach().reshape(n, d).to("cpu", torch.float32, copy=True)
        self.features.append((batch, layer, flat.numpy()))
        self.narrow.add((batch, layer))
        return True

    def add(self, batch: int, first: int, centred: torch.Tensor) -> None:
        """Layers ``first``, ``first + 1``, … of batch ``batch``: their centred Grams (L, n, n),
        U-centred for the unbiased estimator, HKH for the biased one (layers whose features
        were kept are left out: each run of the others is one block)."""
        count, n, _ = centred.shape
        index = _flat_triangle(n, self.estimator)
        rows = centred.detach().reshape(count, n * n)
        start = 0
        while start < count:
            if (batch, first + start) in self.narrow:
                start += 1
                continue
            stop = start + 1
            while stop < count and (batch, first + stop) not in self.narrow:
                stop += 1
            if not self._room(4 * (stop - start) * len(index)):
                return
            if rows.device.type == "cpu":  # NumPy's take: 3 times torch's index_select here
                picked = rows[start:stop].numpy()[:, index]
            else:
                where = torch.from_numpy(index).to(rows.device)
                picked = rows[start:stop].index_select(1, where).cpu().numpy()
            self.grams.append((batch, first + start, picked.astype(np.float32, copy=False)))
            start = stop

    def state(self) -> dict[str, np.ndarray]:
        """The kept numbers as named arrays: ``grams`` ((K, 2): batch and first layer of each
        block ``grams.k`` of triangles), ``features`` ((J, 2): batch and layer of each
        ``features.j``) and ``overflow`` (0 or 1)."""
        out = {
            "grams": np.array([(b, f) for b, f, _ in self.grams], np.int64).reshape(-1, 2),
            "features": np.array([(b, f) for b, f, _ in self.features], np.int64).reshape(-1, 2),
            "overflow": np.array(int(self.overflow)),
        }
        out |= {f"grams.{k}": a for k, (_, _, a) in enumerate(self.grams)}
        return out | {f"features.{k}": a for k, (_, _, a) in enumerate(self.features)}


def _flat_triangle(n: int, estimator: str) -> np.ndarray:
    """Flat indices of the upper triangle of an n × n matrix, and of its diagonal after it for
    the biased estimator."""
    key = (n, estimator)
    if key not in _FLAT:
        i0, i1 = np.triu_indices(n, 1)
        parts = [i0 * n + i1] + ([np.arange(n) * (n + 1)] if estimator == "biased" else [])
        _FLAT[key] = np.concatenate(parts)
    return _FLAT[key]


_FLAT: dict[tuple[int, str], np.ndarray] = {}


def join_kept(states: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Two or more :meth:`KeptCentred.state` of disjoint batches, as one: their blocks, named
    anew (no array is copied)."""
    out: dict[str, np.ndarray] = {
        "overflow": np.array(int(any(int(s["overflow"]) for s in states)))
    }
    for kind in ("grams", "features"):
        tables = [np.asarray(s[kind], np.int64).reshape(-1, 2) for s in states]
        out[kind] = np.concatenate(tables)
        blocks = [
            s[f"{kind}.{k}"]
            for s, table in zip(states, tables, strict=True)
            for k in range(len(table))
        ]
        out |= {f"{kind}.{k}": block for k, block in enumerate(blocks)}
    return out


class _Entry:
    """One kept layer and batch, ready for the draws: its centred Gram as a square (float32),
    or its centred features (float64) with the two vectors the unbiased statistic needs."""

    def __init__(
        self, estimator: str, triangle: np.ndarray | None = None, features: np.ndarray | None = None
    ) -> None:
        self.estimator = estimator
        self.features: np.ndarray | None = None
        self._square: np.ndarray | None = None
        if features is not None:
            x = features.astype(np.float64)
            x -= x.mean(0)  # the same U-centred Gram and HKH, and no large mean to cancel
            self.n, self.d, self.features = x.shape[0], x.shape[1], x
            n = self.n
            # T_u(π) = ‖Xᵀ P Y‖² - Σ_i ‖x_i‖² s_π(i) for centred X, Y (see _statistics)
            self.norms = (x * x).sum(1)
            self.shift = n / (n - 2) * self.norms - self.norms.sum() / ((n - 1) * (n - 2))
        else:
            assert triangle is not None
            n = _side(len(triangle), estimator)
            self.n, self.d = n, 0
            i0, i1 = np.triu_indices(n, 1)
            square = np.zeros((n, n), np.float32)
            square[i0, i1] = triangle[: len(i0)]
            square += square.T
            if estimator == "biased":
                square[np.arange(n), np.arange(n)] = triangle[len(i0) :]
            self._square = square

    @property
    def square(self) -> np.ndarray:
        """The centred Gram, n × n (formed from the features where those were kept)."""
        if self._square is None:
            assert self.features is not None
            k = torch.from_numpy(self.features @ self.features.T)
            if self.estimator == "unbiased":
                k = u_centre(k)  # the centred features' Gram is HKH already
            self._square = k.to(torch.float32).numpy()
        return self._square


def _side(length: int, estimator: str) -> int:
    """n of a kept triangle of ``length`` numbers: n(n-1)/2, or n(n+1)/2 with the diagonal."""
    root = math.isqrt(1 + 8 * length)
    return (1 + root) // 2 if estimator == "unbiased" else (root - 1) // 2


def complete_layers(
    state: dict[str, np.ndarray], estimator: str, batches: int, layers: set[int]
) -> dict[int, list[_Entry]]:
    """Those of ``layers`` kept over all ``batches`` of the run: their entries, in batch order
    (features where both were kept)."""
    if int(state["overflow"]):
        return {}
    found: dict[int, dict[int, _Entry]] = {}
    for k, (batch, layer) in enumerate(np.asarray(state["features"]).reshape(-1, 2).tolist()):
        if layer in layers:
            found.setdefault(layer, {})[batch] = _Entry(estimator, features=state[f"features.{k}"])
    for k, (batch, first) in enumerate(np.asarray(state["grams"]).reshape(-1, 2).tolist()):
        block = state[f"grams.{k}"]
        for layer in range(first, first + len(block)):
            if layer in layers and batch not in found.get(layer, {}):
                found.setdefault(layer, {})[batch] = _Entry(estimator, block[layer - first])
    return {
        layer: [entries[b] for b in sorted(entries)]
        for layer, entries in found.items()
        if len(entries) == batches
    }


def _norm(n: int, estimator: str) -> float:
    return float(n * (n - 3) if estimator == "unbiased" else (n - 1) ** 2)


def _statistics(a: _Entry, b: _Entry, perms: np.ndarray) -> np.ndarray:
    """Σ_ij A_ij B_π(i)π(j) of one batch for each row π of ``perms`` (c, n).

    With both sides' centred features X, Y (narrow enough): the biased statistic is
    ``‖Xᵀ P Y‖²`` (HKH = XXᵀ); the unbiased one, since U-centring only adds terms f_i + f_j
    and a diagonal, which are orthogonal to a U-centred matrix, is ``⟨XXᵀ, P B̃ Pᵀ⟩`` with
    B̃ = YYᵀ + terms in its row sums (0) and diagonal: ``‖Xᵀ P Y‖² - Σ_i ‖x_i‖² s_π(i)``,
    s_i = n/(n-2) ‖y_i‖² - ‖Y‖²/((n-1)(n-2)). Otherwise, as ``Σ_ik A_{i,π⁻¹(k)} B_{π(i),k}``:
    two gathers along one axis each, which NumPy does fast.
    """
    n = a.n
    if a.features is not None and b.features is not None and a.d * b.d <= 4 * n:
        cross = a.features.T @ b.features[perms]  # (c, d, d'): Xᵀ P Y for each π
        t: np.ndarray = (cross * cross).sum((1, 2))
        if a.estimator == "unbiased":
            t -= b.shift[perms] @ a.norms
        return t
    sa, sb = a.square, b.square
    inverse = np.argsort(perms, axis=1)
    out = np.empty(len(perms))
    step = max(1, _CHUNK_VALUES // (n * n))
    for c0 in range(0, len(perms), step):
        rows = np.take(sb, perms[c0 : c0 + step], axis=0)  # (c, n, n): B_{π(i), k}
        cols = np.take(sa, inverse[c0 : c0 + step], axis=1)  # (n, c, n): A_{i, π⁻¹(k)}
        out[c0 : c0 + step] = np.einsum("icn,cin->c", cols, rows)
    return out


def monte_carlo_p(
    kept: dict[int, list[_Entry]],
    cells: np.ndarray,
    denominators: np.ndarray,
    estimator: str,
    seed: int,
    *,
    tick: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Besag & Clifford's sequential p-value and the draws it took, for each of ``cells``
    ((k, 2) layer pairs (i, j), both in ``kept``: :func:`complete_layers`); layer j's samples
    are shuffled within each batch. ``denominators`` (k,): sqrt(HSIC_ii · HSIC_jj), so that
    statistics compare in CKA units, where :data:`analysis.inference.permutation_null.TIE_TOLERANCE`
    applies. ``tick(done, total)`` runs after each cell (it may raise to stop the draws).
    """
    p = np.empty(len(cells))
    draws = np.zeros(len(cells), dtype=np.int64)
    for c, (i, j) in enumerate(np.asarray(cells).reshape(-1, 2).tolist()):
        rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM, i, j]))
        pairs = [(a, b, _norm(a.n, estimator)) for a, b in zip(kept[i], kept[j], strict=True)]
        same = [_statistics(a, b, np.arange(a.n)[None])[0] / norm for a, b, norm in pairs]
        observed = sum(same) / denominators[c]  # as the draws compute it: ties stay ties
        exceed, done, size = 0, 0, _FIRST_ROUND
        while exceed < EXCEEDANCES and done < MAX_DRAWS:
            count = min(size, MAX_DRAWS - done)
            null = np.zeros(count)
            for a, b, norm in pairs:
                perms = rng.permuted(np.tile(np.arange(a.n), (count, 1)), axis=1)
                null += _statistics(a, b, perms) / norm
            hits = np.flatnonzero(null / denominators[c] >= observed - TIE_TOLERANCE)
            if exceed + len(hits) >= EXCEEDANCES:  # the h-th exceedance ends the run there
                done += int(hits[EXCEEDANCES - exceed - 1]) + 1
                exceed = EXCEEDANCES
            else:
                exceed, done = exceed + len(hits), done + count
            size *= 2
        draws[c] = done
        p[c] = EXCEEDANCES / done if exceed == EXCEEDANCES else (exceed + 1) / (done + 1)
        if tick is not None:
            tick(c + 1, len(cells))
    return p, draws


def moment_bound(
    excess: np.ndarray, sd: np.ndarray, fourth: np.ndarray | None = None
) -> np.ndarray:
    """An upper bound on P(null - mean ≥ excess) from the null's exact variance ``sd²`` and,
    where given, its fourth cumulant ``fourth`` (all arrays in one unit), whatever its shape.

    Cantelli: ``sd² / (sd² + x²)``. With the fourth central moment m₄ = κ₄ + 3 sd⁴, Cantelli's
    inequality for Y = (null - mean)² (mean sd², variance m₄ - sd⁴) gives, for x > sd,
    ``(m₄ - sd⁴) / (m₄ - sd⁴ + (x² - sd²)²)``. The smaller of the two; 1 where x ≤ 0.
    """
    x = np.asarray(excess, dtype=np.float64)
    var = np.asarray(sd, dtype=np.float64) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(x > 0, var / (var + x**2), 1.0)
        if fourth is not None:
            spread = np.maximum(np.asarray(fourth) + 2 * var**2, 0.0)  # Var[(X - μ)²]
            tighter = spread / (spread + (x**2 - var) ** 2)
            bound = np.where(x**2 > var, np.minimum(bound, tighter), bound)
    return np.where(np.isfinite(bound), bound, 1.0)
