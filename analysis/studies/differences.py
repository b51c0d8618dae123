"""Differences between study arms with intervals that respect the crossed seeds.

A study's diagonal CKA of an arm is a table ``Y[i, j]``: rows the reference's seeds, columns
the arm's seeds, each cell the mean diagonal CKA of that (reference model, arm model) pair.
Both seed sources are random, and they are crossed: every arm shares the reference's rows. The
model behind every interval here is the two-way crossed random-effects model

    Y[i, j] = μ + r_i + c_j + e_ij,   r ~ (0, σ_r²), c ~ (0, σ_c²), e ~ (0, σ_e²),

one per arm, with the row effects of two arms correlated (they are the same reference model).

**Estimate.** The difference of two arms A and B, ``D = Ȳ_A − Ȳ_B``, is the mean over reference
seeds of the row differences ``z_i = Ȳ_A[i, ·] − Ȳ_B[i, ·]``: differences against one reference
seed are paired, so whatever reference seed i does to both arms cancels in ``z_i``.

**Variance** (method of moments, the ANOVA decomposition of each complete table)::

    Var(D) = Var(r_A − r_B)/n_r + σ_cA²/n_A + σ_eA²/(n_r n_A) + (the same for B)
    V̂ = s_z²/n_r + Σ_arms max(MS_C − MS_E, 0)/(n_r n_arm) + v_input

``s_z²`` (the sample variance of the ``z_i``, n_r − 1 df) has expectation
``Var(r_A − r_B) + σ_eA²/n_A + σ_eB²/n_B``; ``MS_C`` (columns, n − 1 df) and ``MS_E`` (residual,
(n_r − 1)(n − 1) df) of each table give ``σ_c² = (E MS_C − E MS_E)/n_r``, truncated at zero.

**Against the seed-to-seed baseline** (the reference's models against each other, unordered pairs
i < k: ``B̄ = μ_0 + 2ū + f̄``), ``z_i`` takes the baseline's jackknife pseudo-value over reference
seeds, ``n_r B̄ − (n_r − 1) B̄_(−i)``, in place of ``Ȳ_B[i, ·]``: its mean is ``B̄`` and its spread
carries the baseline's reference-seed effect 2u_i. With 3 reference seeds the baseline's own
residual cannot be told from its seed effect (3 pairs, 3 parameters), so this is the
Efron–Stein jackknife bound: conservative by the baseline's residual variance, exact without it.

**Interval.** With 3 × 3 seeds ``V̂`` rests on a few degrees of freedom and has a negative
coefficient; Satterthwaite's t-interval then covers about 98 % where the residual dominates
(bench/bench_differences.py), and a crossed ("pigeonhole", Owen 2007) bootstrap over three seeds
per side has too few distinct resamples to be trusted. The reference quantile is calibrated
instead by a parametric bootstrap of the mean squares themselves: under normal effects they are
independent scaled χ² variables with expectations fitted from the estimates (each constrained to
the model: ``E MS_C ≥ E MS_E``), so ``q`` is the ``level`` quantile of ``|Z|·√(V_fit / V̂*)``
over draws of ``V̂*``, and the interval is ``D ± q √V̂`` (a bootstrap-t). The p-value of D = 0 is
the share of draws with ``|Z|·√(V_fit / V̂*) ≥ |D|/√V̂``. Over 2,000 simulated 3 × 3 studies per
setting this covers 94–96 % where the t-interval over the 9 pairs covers 63–95 %.

**Components.** The fitted mean squares are those of the model's components, each estimated by
:func:`components` and constrained to be ≥ 0: ``rows`` = (s_z² − Σ MS_E/n)₊ (the paired
reference-seed effect), per arm table ``columns`` σ_c² = (MS_C − MS_E)₊/n_r and ``residuals``
σ_e² = MS_E, and ``images`` = v_input (:class:`Components`). How V scales with the seeds of each
side is :meth:`Components.variance`; :mod:`analysis.studies.power` plans seeds from it.

**Images.** ``v_input`` is the sampling noise of the images: every model sees the same test
images, which no seed count resamples. When both sides carry their tables' per-image
projections (``image_terms``, :func:`analysis.studies.summary.table_image_terms`), the two
sides were computed over the same images and ``v_input = Σ_a (T_A(a) − T_B(a))²``, the first-
order variance of the difference itself (:mod:`analysis.inference.paired_images`): what moves
both arms' CKA with the Mixer together cancels, as the reference seed's effect does in ``z_i``
(``images: "paired"``). Without them (an older summary, an atlas too large to keep them) it
falls back to the bound of the two tables' errors taken as independent: ``v_input`` is the sum
over the two sides of ``(mean se)²``, each table's mean over its cells of their image standard
error (se = width / (2 · 1.96)), conservative since what differs between cells is also in the
residual and the shared part is counted twice (``images: "summed"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.inference.paired_images import paired_variance

__all__ = [
    "DRAWS",
    "ArmTable",
    "Components",
    "Difference",
    "baseline_pseudo_values",
    "components",
    "crossed_difference",
    "decision",
    "image_variance",
    "mean_squares",
    "study_differences",
    "variance_draws",
]

DRAWS = 4000


@dataclass(frozen=True)
class _MeanSquare:
    value: float
    df: int


def mean_squares(table: np.ndarray) -> tuple[_MeanSquare, _MeanSquare]:
    """Column and residual mean squares of a complete two-way table (rows × columns)."""
    n_rows, n_cols = table.shape
    grand = table.mean()
    rows = table.mean(axis=1, keepdims=True)
    cols = table.mean(axis=0, keepdims=True)
    ms_c = n_rows * float(((cols - grand) ** 2).sum()) / (n_cols - 1)
    resid = table - rows - cols + grand
    df_e = (n_rows - 1) * (n_cols - 1)
    ms_e = float((resid**2).sum()) / df_e
    return _MeanSquare(ms_c, n_cols - 1), _MeanSquare(ms_e, df_e)


def baseline_pseudo_values(pairs: np.ndarray) -> np.ndarray:
    """Jackknife pseudo-values over reference seeds of the mean over unordered pairs i < k.

    ``pairs`` is the n_r × n_r table of reference-against-reference values (only i < k is read);
    needs n_r ≥ 3 so that leaving one seed out keeps a pair.
    """
    n = pairs.shape[0]
    upper = np.triu_indices(n, k=1)
    values = pairs[upper]
    whole = float(values.mean())
    out = np.empty(n)
    for i in range(n):
        keep = (upper[0] != i) & (upper[1] != i)
        out[i] = n * whole - (n - 1) * float(values[keep].mean())
    return out


@dataclass(frozen=True)
class Difference:
    """A difference with its 95 % interval: estimate, low, high, p_value, se (√V̂); and what
    it rests on: its variance ``components``, its ``reference`` seeds and each arm table's."""

    estimate: float
    low: float
    high: float
    p_value: float
    se: float
    components: Components | None = None
    reference: int = 0
    arms: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "p_value": self.p_value,
            "se": self.se,
        }

    def variance_dict(self) -> dict[str, Any] | None:
        """summary.json's ``variance`` of a difference: its components and the seeds they had."""
        if self.components is None:
            return None
        seeds = {"reference": self.reference, "arms": list(self.arms)}
        return {**self.components.as_dict(), "seeds": seeds}


@dataclass(frozen=True)
class Components:
    """The variance components of one difference, as the crossed model has them.

    ``rows``: the variance of the paired reference-seed effect, Var(r_A − r_B) (against the
    baseline, Var(r_A − 2u) with the baseline's residual in it: the Efron–Stein bound);
    ``columns`` and ``residuals``: σ_c² and σ_e² of each arm table in the difference (one or
    two); ``images``: the images' sampling noise, ``v_input``, which no seed count shrinks;
    ``min_seeds``: the fewest reference seeds an interval needs (3 against the baseline).
    Estimated by :func:`components`; the planner (:mod:`analysis.studies.power`) reads them.
    """

    rows: float
    columns: tuple[float, ...]
    residuals: tuple[float, ...]
    images: float = 0.0
    min_seeds: int = 2

    def expected_squares(
        self, reference: int, arms: Sequence[int]
    ) -> tuple[float, list[tuple[float, float]]]:
        """E s_z² and each table's (E MS_C, E MS_E) with ``reference`` × ``arms[k]`` seeds."""
        row = self.rows + sum(e / n for e, n in zip(self.residuals, arms, strict=True))
        cols = [(e + reference * c, e) for c, e in zip(self.columns, self.residuals, strict=True)]
        return row, cols

    def variance(self, reference: int, arms: Sequence[int]) -> float:
        """Var(D) with ``reference`` seeds and ``arms[k]`` seeds in arm table k (module)."""
        row, cols = self.expected_squares(reference, arms)
        return float(_v_hat(row, cols, reference, arms, self.images))

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "columns": list(self.columns),
            "residuals": list(self.residuals),
            "images": self.images,
            "min_seeds": self.min_seeds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Components:
        return cls(
            rows=float(data["rows"]),
            columns=tuple(float(v) for v in data["columns"]),
            residuals=tuple(float(v) for v in data["residuals"]),
            images=float(data.get("images") or 0.0),
            min_seeds=int(data.get("min_seeds") or 2),
        )


def _v_hat(
    row: Any, cols: Sequence[tuple[Any, Any]], reference: int, arms: Sequence[int], images: float
) -> Any:
    """V̂ from mean squares (arrays of draws or numbers): s_z²/n_r + Σ (MS_C − MS_E)₊/(n_r n)."""
    total = row / reference + images
    for (c, e), n in zip(cols, arms, strict=True):
        total = total + np.maximum(c - e, 0.0) / (reference * n)
    return total


def components(
    rows: np.ndarray, tables: Sequence[np.ndarray], *, input_var: float = 0.0, min_seeds: int = 2
) -> Components:
    """The method-of-moments components of a difference, each constrained to the model.

    ``rows`` and ``tables`` as :func:`crossed_difference` takes them: σ_e² = MS_E,
    σ_c² = (MS_C − MS_E)₊/n_r and the rows' Var = (s_z² − Σ MS_E/n)₊; their expected mean
    squares are the fitted ones the interval's quantile is calibrated with.
    """
    z = np.asarray(rows, dtype=float)
    n_r = z.size
    if n_r < 2 or not np.isfinite(z).all():
        raise ValueError("a crossed difference needs finite row values of at least two seeds")
    columns, residuals, shares = [], [], 0.0
    for table in tables:
        t = np.asarray(table, dtype=float)
        if t.shape[0] != n_r or t.shape[1] < 2 or not np.isfinite(t).all():
            raise ValueError("each arm table needs one complete row per reference seed, 2+ columns")
        c, e = mean_squares(t)
        columns.append(max(c.value - e.value, 0.0) / n_r)
        residuals.append(e.value)
        shares += e.value / t.shape[1]
    row_var = float(z.var(ddof=1))
    return Components(
        max(row_var - shares, 0.0), tuple(columns), tuple(residuals), input_var, min_seeds
    )


def variance_draws(
    parts: Components, reference: int, arms: Sequence[int], draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Draws of V̂ at a design: its mean squares as independent scaled χ² (normal effects)."""

    def scaled(mean: float, df: int) -> Any:
        return mean * rng.chisquare(df, size=draws) / df

    row, cols = parts.expected_squares(reference, arms)
    row_star = scaled(row, reference - 1)
    cols_star = [
        (scaled(ec, n - 1), scaled(ee, (reference - 1) * (n - 1)))
        for (ec, ee), n in zip(cols, arms, strict=True)
    ]
    v_star = _v_hat(row_star, cols_star, reference, arms, parts.images)
    return np.asarray(np.maximum(v_star, np.finfo(float).tiny))


def crossed_difference(
    rows: np.ndarray,
    tables: Sequence[np.ndarray],
    *,
    input_var: float = 0.0,
    level: float = 0.95,
    draws: int = DRAWS,
    seed: int = 0,
    min_seeds: int = 2,
) -> Difference:
    """The difference ``mean(rows)`` with its interval (see the module docstring).

    ``rows``: one value per reference seed, ``z_i`` (an arm's row mean minus the other side's row
    mean or baseline pseudo-value). ``tables``: the complete n_r × n tables of the arms in the
    difference (one or two), whose column (arm-seed) variance is added. ``input_var``: the
    variance of the images' sampling noise in the difference (0 when unknown). The result
    carries its :class:`Components` (``min_seeds`` is recorded there for the planner).
    """
    parts = components(rows, tables, input_var=input_var, min_seeds=min_seeds)
    z = np.asarray(rows, dtype=float)
    n_r = z.size
    arms = [np.shape(t)[1] for t in tables]
    estimate = float(z.mean())
    # V̂ reads the columns' mean squares only through (MS_C − MS_E)₊, as the fit keeps it
    _, fitted_cols = parts.expected_squares(n_r, arms)
    observed = float(_v_hat(float(z.var(ddof=1)), fitted_cols, n_r, arms, input_var))
    v_fit = parts.variance(n_r, arms)
    if v_fit <= 0.0 or observed <= 0.0:  # every value identical: no spread to speak of
        p_value = 1.0 if estimate == 0 else 0.0
        return Difference(estimate, estimate, estimate, p_value, 0.0, parts, n_r, tuple(arms))
    rng = np.random.default_rng(seed)
    v_star = variance_draws(parts, n_r, arms, draws, rng)
    pivot = np.abs(rng.standard_normal(draws)) * np.sqrt(v_fit / v_star)
    quantile = float(np.quantile(pivot, level))
    se = math.sqrt(observed)
    t_obs = abs(estimate) / se
    p_value = float((np.count_nonzero(pivot >= t_obs) + 1) / (draws + 1))
    low, high = estimate - quantile * se, estimate + quantile * se
    return Difference(estimate, low, high, p_value, se, parts, n_r, tuple(arms))


def decision(low: float | None, high: float | None) -> str | None:
    """``"closer"`` (to the reference than the other side: the interval above 0), ``"farther"``
    (below 0), ``"undecided"`` (it holds 0), None without an interval."""
    if low is None or high is None:
        return None
    return "closer" if low > 0 else "farther" if high < 0 else "undecided"


@dataclass(frozen=True)
class ArmTable:
    """One arm's diagonal-CKA table against the reference (rows its seeds, columns the arm's).

    ``input_se``: the mean over cells of each cell's image-sampling standard error, None when the
    comparison has no intervals. ``is_reference``: the arm's models are the reference's own (its
    table is the seed-to-seed table, and it is compared as the baseline is). ``image_terms``:
    each image's projection of the table's mean (the module's **Images**), None without them.
    """

    name: str
    table: np.ndarray | None
    input_se: float | None = None
    is_reference: bool = False
    image_terms: np.ndarray | None = None


def _complete(table: np.ndarray | None, n_r: int) -> bool:
    return (
        table is not None
        and table.ndim == 2
        and table.shape[0] == n_r
        and table.shape[1] >= 2
        and bool(np.isfinite(table).all())
    )


def _side(
    arm: ArmTable, baseline: ArmTable, n_r: int
) -> tuple[np.ndarray, list[np.ndarray], ArmTable] | None:
    """(row values, tables whose columns add variance, the table whose image noise it carries)
    of one side of a difference."""
    if arm.is_reference:
        arm = baseline
    if arm is baseline:
        if arm.table is None or n_r < 3:
            return None
        pseudo = baseline_pseudo_values(arm.table)
        return (pseudo, [], arm) if np.isfinite(pseudo).all() else None
    if arm.table is None or not _complete(arm.table, n_r):
        return None
    return arm.table.mean(axis=1), [arm.table], arm


def image_variance(left: ArmTable, right: ArmTable) -> tuple[float, str | None]:
    """(v_input, how): the paired variance of the two tables' image projections when both have
    them over the same images, else the sum of their ``input_se``² (the module's **Images**);
    ``how`` is ``"paired"``, ``"summed"``, or None (0: neither side has image noise)."""
    a, b = left.image_terms, right.image_terms
    if a is not None and b is not None and a.shape == b.shape:
        return paired_variance(a, b), "paired"
    ses = [s for s in (left.input_se, right.input_se) if s is not None]
    return (sum(s * s for s in ses), "summed") if ses else (0.0, None)


def _point(arm: ArmTable, baseline: ArmTable) -> float | None:
    source = baseline if arm.is_reference else arm
    if source.table is None:
        return None
    values = source.table[np.isfinite(source.table)]
    if source is baseline:
        values = source.table[np.triu_indices(source.table.shape[0], k=1)]
        values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else None


def study_differences(
    arms: Sequence[ArmTable], baseline: ArmTable, matched: str | None, level: float = 0.95
) -> list[dict[str, Any]]:
    """Every arm against the matched arm and against the seed-to-seed baseline.

    ``baseline.table`` is the reference × reference table (its own seeds on both sides; only
    i < k is read). Each item: ``{"arm", "versus", "estimate", "low", "high", "p_value", "se",
    "input_se", "images", "variance"}`` (``input_se`` = √v_input; ``images``: ``"paired"`` or
    ``"summed"``, see :func:`image_variance`) with ``versus`` the matched arm's name or
    ``"seed_to_seed"``;
    ``low``/``high``/``p_value`` are None where the seeds do not allow an interval (fewer than 3
    reference seeds against the baseline, fewer than 2 per side otherwise), and so is
    ``variance`` (:meth:`Difference.variance_dict`: the :class:`Components` and the seeds). The
    matched arm is not compared with itself, nor an arm made of the reference's own models with
    the baseline. ``decision``: see :func:`decision`.
    """
    n_r = 0 if baseline.table is None else baseline.table.shape[0]
    by_name = {a.name: a for a in arms}
    out: list[dict[str, Any]] = []
    for arm in arms:
        versus: list[ArmTable] = []
        if matched is not None and matched != arm.name and matched in by_name:
            versus.append(by_name[matched])
        if not arm.is_reference:
            versus.append(baseline)
        for other in versus:
            if other.is_reference and arm.is_reference:
                continue
            a, b = _point(arm, baseline), _point(other, baseline)
            item: dict[str, Any] = {
                "arm": arm.name,
                "versus": "seed_to_seed" if other is baseline else other.name,
                "estimate": None if a is None or b is None else a - b,
                "low": None,
                "high": None,
                "p_value": None,
                "se": None,
                "input_se": None,
                "images": None,
                "variance": None,
            }
            left, right = _side(arm, baseline, n_r), _side(other, baseline, n_r)
            if left is not None and right is not None:
                input_var, how = image_variance(left[2], right[2])
                against_baseline = arm.is_reference or other is baseline or other.is_reference
                diff = crossed_difference(
                    left[0] - right[0],
                    [*left[1], *right[1]],
                    input_var=input_var,
                    level=level,
                    min_seeds=3 if against_baseline else 2,
                )
                item.update(diff.as_dict())
                item["variance"] = diff.variance_dict()
                both = None not in (left[2].input_se, right[2].input_se)
                if how == "paired" or both:
                    item["input_se"] = math.sqrt(input_var)
                    item["images"] = how
            item["decision"] = decision(item["low"], item["high"])
            out.append(item)
    return out
