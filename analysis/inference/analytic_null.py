"""The analytic null of one run: its cumulants summed over batches, the tail check, the p-values.

:class:`AnalyticNull` is what a run adds to per batch: every layer's invariants give every
cell's exact null cumulants (:mod:`analysis.inference.null_moments`), summed in float64, and, within
a byte budget, every layer's centred Grams (:class:`analysis.inference.null_draws.KeptCentred`). Its
state is named arrays; two states of disjoint batches add (:func:`join_states`); :func:`finish`
turns the whole plan's state into every cell's p-value, null mean and 95 % quantile.

**The tail check.** The p-value of the Pearson type III fitted to the first three moments is
only as good as the fit's tail. The exact fourth cumulant says how good: a Pearson type III
with skewness γ has excess kurtosis 1.5 γ², and a cell's *departure* is the null's exact
excess kurtosis minus that. Where |departure| ≤ :data:`DEPARTURE` the fitted p stands (an
Edgeworth term puts the error it leaves at α = 0.01 near 0.006·departure). Elsewhere — low-rank
layers with heavy-tailed features on both sides — the cell's p is the moment bound where that
is already below the smallest Monte Carlo p, else a sequential Monte Carlo p from within-batch
permutations of the kept Grams (:mod:`analysis.inference.null_draws`). The summary says per cell
which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from analysis.errors import AnalysisError
from analysis.estimators.hsic import cka_from_hsic
from analysis.inference.null_draws import (
    MAX_DRAWS,
    KeptCentred,
    complete_layers,
    join_kept,
    moment_bound,
    monte_carlo_p,
)
from analysis.inference.null_moments import (
    SUMS,
    NullMoments,
    batch_moments,
    layer_invariants,
    moments_from_sums,
    u_centre,
)
from analysis.inference.permutation_null import NullSummary

__all__ = [
    "DEPARTURE",
    "AnalyticNull",
    "finish",
    "flagged_cells",
    "join_states",
    "layers_to_keep",
    "tail_warning",
]

# A cell's fitted null holds where |departure| (its exact excess kurtosis minus the fit's)
# is at most this; elsewhere the cell's p comes from permutations (see finish).
DEPARTURE = 0.25


class AnalyticNull:
    """Sums the null cumulants of every cell over the batches of one run (float64, on host),
    and with ``keep`` (a byte budget) keeps every layer's centred Grams for the cells whose
    fit fails the tail check (:class:`analysis.inference.null_draws.KeptCentred`).

    Its state (:meth:`state`) is named arrays: ``sums`` (rows :data:`SUMS`) and, when kept,
    ``kept.*`` (:meth:`analysis.inference.null_draws.KeptCentred.state`); two states of disjoint
    batches add (:func:`join_states`), and :func:`finish` turns one into the cells' p-values.
    """

    def __init__(
        self,
        total_layers: int,
        estimator: str,
        dtype: torch.dtype = torch.float64,
        keep: int | None = None,
    ) -> None:
        self.estimator, self.dtype = estimator, dtype
        self.sums = np.zeros((len(SUMS), total_layers, total_layers))
        self._work: torch.Tensor | None = None
        self.kept = None if keep is None else KeptCentred(estimator, keep)

    def _buffers(self, centred: torch.Tensor) -> torch.Tensor:
        """:func:`layer_invariants`' work buffer (L, 3, n, n), reused while the shape holds."""
        count, n, _ = centred.shape
        work = self._work
        if work is None or work.shape != (count, 3, n, n) or work.device != centred.device:
            work = self._work = torch.empty(count, 3, n, n, dtype=self.dtype, device=centred.device)
        return work

    def invariants(
        self,
        centred: torch.Tensor,
        batch: int | None = None,
        first: int = 0,
        row_sums: torch.Tensor | None = None,
    ) -> np.ndarray:
        """:func:`layer_invariants` (L, 12) of one batch's double-centred Grams (L, n, n) (and
        their row sums (L, n) where the caller has them); when keeping, and given the batch's
        index in the plan, the Grams are kept as the run's layers ``first``, ``first + 1``, …"""
        work = self._buffers(centred)
        inv = layer_invariants(centred, self.estimator, self.dtype, work, row_sums).cpu().numpy()
        if self.kept is not None and batch is not None:  # work[:, 0]: the U-centred copy
            self.kept.add(batch, first, work[:, 0] if self.estimator == "unbiased" else centred)
        return inv

    def keep_features(self, batch: int, layer: int, features: torch.Tensor) -> None:
        """Where a layer's kernel is linear, keep its features (n, …) of batch ``batch`` instead
        of its Gram when they are the smaller (call before :meth:`add` for that batch)."""
        if self.kept is not None:
            self.kept.add_features(batch, layer, features)

    def keep(
        self,
        centred: torch.Tensor,
        batch: int,
        first: int = 0,
        row_sums: torch.Tensor | None = None,
    ) -> None:
        """Keep one batch's Grams (as :meth:`invariants` does) whose invariants came from
        elsewhere (the Gram store)."""
        if self.kept is None:
            return
        if self.estimator == "unbiased":
            centred = u_centre(centred, self.dtype, self._buffers(centred)[:, 0], row_sums)
        self.kept.add(batch, first, centred)

    def add(
        self,
        centred: torch.Tensor,
        batch: int | None = None,
        row_sums: torch.Tensor | None = None,
    ) -> None:
        """One batch, given its double-centred Grams (L, n, n) (see :func:`layer_invariants`)
        and, where the caller has them, their row sums (L, n)."""
        self.add_invariants(self.invariants(centred, batch, 0, row_sums), centred.shape[-1])

    def add_invariants(self, inv: np.ndarray, n: int) -> None:
        """One batch of ``n`` samples, given every layer's invariants (L, 12), in layer order."""
        self.sums += batch_moments(inv, n, self.estimator)

    def state(self) -> dict[str, np.ndarray]:
        """The sums and, when kept, the kept Grams, as named arrays."""
        kept = {} if self.kept is None else self.kept.state()
        return {"sums": self.sums} | {f"kept.{k}": v for k, v in kept.items()}

    def summary(
        self, hsic: np.ndarray, seed: int = 0, batches: int | None = None
    ) -> tuple[NullSummary, dict[str, Any]]:
        """The cells' null summary against the run's summed HSIC ``hsic`` (see :func:`finish`);
        ``batches``: how many the run kept (needed where Grams were kept)."""
        return finish(self.state(), hsic, self.estimator, seed, batches or 0)


def join_states(states: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """:meth:`AnalyticNull.state` of ranges of one plan, as the whole plan's: sums add, kept
    Grams join (an error if only some ranges kept them)."""
    out = {"sums": np.sum([np.asarray(s["sums"]) for s in states], axis=0)}
    has = [any(k.startswith("kept.") for k in s) for s in states]
    if any(has) and not all(has):
        raise AnalysisError("some partials kept Grams for the analytic null and some did not")
    if all(has):
        kept = join_kept(
            [{k[5:]: v for k, v in s.items() if k.startswith("kept.")} for s in states]
        )
        out |= {f"kept.{k}": v for k, v in kept.items()}
    return out


def flagged_cells(
    sums: np.ndarray, hsic: np.ndarray, estimator: str, tests: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The tests ((L, L) booleans, default i < j) that fail the tail check, as (k, 2) layer
    pairs, and each one's moment bound on its p-value (see :func:`finish`)."""
    return _flagged(moments_from_sums(sums, hsic), sums, hsic, estimator, tests)


def _flagged(
    moments: NullMoments,
    sums: np.ndarray,
    hsic: np.ndarray,
    estimator: str,
    tests: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    if tests is None:
        tests = np.triu(np.ones(hsic.shape, dtype=bool), 1)
    defined = np.isfinite(moments.departure) & np.isfinite(cka_from_hsic(hsic))
    cells = np.argwhere(tests & defined & (np.abs(moments.departure) > DEPARTURE))
    i, j = cells.T
    # in HSIC units: the exact variance, and the exact fourth cumulant when unbiased
    fourth = sums[5][i, j] if estimator == "unbiased" else None
    return cells, moment_bound(hsic[i, j] - sums[0][i, j], np.sqrt(sums[1][i, j]), fourth)


def layers_to_keep(sums: np.ndarray, hsic: np.ndarray, estimator: str) -> set[int]:
    """The layers of the cells that will draw permutations (flagged, not settled by the bound),
    judged on the sums at hand: a run with the Gram store reads these layers' Grams back."""
    cells, bound = flagged_cells(sums, hsic, estimator)
    return {int(v) for v in cells[bound > 1 / (MAX_DRAWS + 1)].reshape(-1)}


def finish(
    state: dict[str, np.ndarray],
    hsic: np.ndarray,
    estimator: str,
    seed: int,
    batches: int,
    tests: np.ndarray | None = None,
    *,
    tick: Callable[[int, int], None] | None = None,
) -> tuple[NullSummary, dict[str, Any]]:
    """Every cell's p-value, null mean and 95 % quantile from a run's :meth:`AnalyticNull.state`
    and summed HSIC, with what each p rests on, and a record of the tail check.

    ``tests``: the cells that are tests ((L, L) booleans; default every pair of distinct
    layers, i < j). A test whose |departure| exceeds :data:`DEPARTURE` gets, instead of the
    fitted p, the moment bound where it is below 1/(MAX_DRAWS + 1), else a sequential Monte
    Carlo p from the kept Grams (``batches``: how many the run kept; a layer kept over fewer
    has none), else keeps the fitted p, counted as ``without_draws``. The mirror cell (j, i)
    carries the same. ``seed`` seeds the draws; ``tick(done, total)`` runs after each cell's
    draws (it may raise to stop them).
    """
    sums = np.asarray(state["sums"])
    moments = moments_from_sums(sums, hsic)
    p, q95 = _fitted(moments, cka_from_hsic(hsic))
    method = np.where(np.isfinite(p), "analytic", "").astype(object)
    draws = np.zeros(p.shape, dtype=np.int64)
    if tests is None:
        tests = np.triu(np.ones(p.shape, dtype=bool), 1)
    cells, bound = _flagged(moments, sums, hsic, estimator, tests)
    i, j = cells.T
    d = np.sqrt(np.diag(hsic)[i] * np.diag(hsic)[j])
    huge = bound <= 1 / (MAX_DRAWS + 1)
    kept = {}
    if "kept.overflow" in state and not huge.all():
        own = {k[5:]: v for k, v in state.items() if k.startswith("kept.")}
        kept = complete_layers(own, estimator, batches, set(cells[~huge].reshape(-1).tolist()))
    drawn = ~huge & np.array([a in kept and b in kept for a, b in cells.tolist()], dtype=bool)
    mc_p, mc_draws = monte_carlo_p(kept, cells[drawn], d[drawn], estimator, seed, tick=tick)
    for sel, values, how, counts in (
        (huge, bound[huge], "bound", 0),
        (drawn, mc_p, "monte_carlo", mc_draws),
    ):
        a, b = i[sel], j[sel]
        p[a, b] = p[b, a] = values
        method[a, b] = method[b, a] = how
        draws[a, b] = draws[b, a] = counts
    summary = NullSummary(p, moments.mean, q95, draws, method)
    record: dict[str, Any] = {
        "check": f"|excess kurtosis - Pearson III's| > {DEPARTURE}",
        "tests": int(tests.sum()),
        "flagged": len(cells),
        "bound": int(huge.sum()),
        "monte_carlo": int(drawn.sum()),
        "draws": int(mc_draws.sum()),
        "without_draws": int((~huge & ~drawn).sum()),
        "kept": _kept_note(state),
    }
    return summary, record


def _fitted(moments: NullMoments, cka: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fitted Pearson type III's p-value of ``cka`` and its 95 % quantile, per cell: each
    computed once per pair of layers, on and above the diagonal, and mirrored (the sums and
    the observed HSIC are symmetric in i, j, so cell (j, i) has the same moments as (i, j))."""
    upper = np.triu_indices(len(cka))
    m = moments
    half = NullMoments(m.mean[upper], m.sd[upper], m.skew[upper], m.departure[upper])
    out = []
    for values in (half.p_values(cka[upper]), half.quantile(0.95)):
        full = np.empty(cka.shape)
        full[upper] = values
        full.T[upper] = values
        out.append(full)
    return out[0], out[1]


def _kept_note(state: dict[str, np.ndarray]) -> str:
    if "kept.overflow" not in state:
        return "none: the plan's Grams would exceed the budget"
    if int(state["kept.overflow"]):
        return "none: the Grams outgrew the budget"
    size = sum(np.asarray(v).nbytes for k, v in state.items() if k.count(".") == 2)
    return f"{size / 2**20:.1f} MiB"


def tail_warning(record: dict[str, Any]) -> str:
    """The sentence for flagged cells that kept their fitted p (``record``: :func:`finish`'s)."""
    count, kept = record["without_draws"], record["kept"]
    why = kept if kept.startswith("none") else "some batches of their layers were not kept"
    return (
        f"{count} cell{'s' if count != 1 else ''} failed the analytic null's tail check but "
        f"kept the fitted p-value, which can be too small at small α (Grams kept: {why}); "
        f"use null: permutation for them"
    )
