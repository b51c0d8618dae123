"""Kornblith et al. 2019's layer-identification test, as a pure function of similarity blocks.

Given K models of one architecture (seeds) with the same L layers and a similarity measure,
``sims[i, j]`` is the (L, L) block of model i's layers (rows) against model j's (columns).
For every ordered pair of distinct models (i, j) and every layer ℓ of model i, the test asks
whether the layer of model j most similar to i:ℓ is j:ℓ, the layer at the same depth.

Ties
    When several layers share the row's maximum and ℓ is one of them, the row scores
    1 / (number of tied layers): the expected score of breaking the tie uniformly at random.
    A measure that saturates (every cell 1, as CCA does when features outnumber images) thus
    scores 1/L rather than 100 %. Exact equality decides a tie; NaN cells (an undefined
    similarity, e.g. a constant layer) never win, and a row with no finite cell has no answer
    and is left out of the counts.

Accuracy
    The mean score over every (i, j, ℓ) with an answer: K (K − 1) L rows in all.

Interval (95 %, percentile bootstrap over models)
    The seeds are the sampling unit, not the layers (the layers of one model are not
    independent draws). A resample draws K of the K models with replacement and recomputes the
    accuracy over the ordered pairs of distinct draws; two draws of the same model are one
    model twice, and a model is never compared with itself, so such pairs are left out. With
    ``c_m`` copies of model m the resample's accuracy is therefore
    Σ_{m≠m'} c_m c_m' S[m, m'] / Σ_{m≠m'} c_m c_m' N[m, m'], where S[m, m'] is the pair's summed
    score and N[m, m'] its number of answered rows. A resample that drew a single model has no
    pair and is skipped. The interval is the 2.5 and 97.5 percentiles (NumPy's linear
    interpolation) of the rest, from a generator seeded with ``seed``: the same input, the
    same interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.measures import MEASURES as ATLAS_MEASURES

__all__ = [
    "LEVEL",
    "MEASURES",
    "RESAMPLES",
    "Identification",
    "atlas_options",
    "check_measures",
    "hits",
    "identification",
    "identification_table",
    "markdown_table",
    "measure_block",
    "rbf_measure",
    "score",
    "similarities",
]

LEVEL = 0.95
RESAMPLES = 2000

# The measures the study scores on the linear comparison, in Kornblith 2019 Table 2's order,
# then Procrustes and mutual k-NN (the CKA RBF ones come from one comparison per bandwidth, see
# atlas_options). "hsic" is the unnormalised HSIC of the same comparison (Atlas.hsic_block); the
# rest are what analysis.compare(..., measures=...) computes (analysis.measures.MEASURES).
MEASURES: tuple[str, ...] = (
    "cca_mean",
    "cca",
    "svcca",
    "pwcca",
    "linreg",
    "hsic",
    "cka",
    "procrustes",
    "mutual_knn",
)
# Every measure an atlas knows.
KNOWN_MEASURES = ("hsic", *ATLAS_MEASURES)


def check_measures(measures: Sequence[str]) -> None:
    """ValueError, one sentence, for an unknown measure or one listed twice."""
    unknown = [m for m in measures if m not in KNOWN_MEASURES]
    if unknown:
        raise ValueError(f"unknown measures {unknown}; the measures are {list(KNOWN_MEASURES)}")
    if len(set(measures)) != len(measures):
        raise ValueError(f"a measure is listed twice: {list(measures)}")


def rbf_measure(t: float) -> str:
    """The name of CKA with the RBF kernel at σ = t × the median distance: ``cka_rbf_<t>``."""
    return f"cka_rbf_{t:g}"


def atlas_options(
    cka: Mapping[str, Any], measures: Sequence[str], rbf: Sequence[float]
) -> dict[str, dict[str, Any]]:
    """The comparisons of an identification study, by name: ``main`` (``cka`` with the linear
    kernel, asking the engine for the measures beyond CKA and HSIC) and one per RBF bandwidth
    multiplier t, named :func:`rbf_measure`, with kernel ``rbf:t``."""
    main = dict(cka)
    extra = [m for m in measures if m not in ("cka", "hsic")]
    if extra:
        main["measures"] = ["cka", *extra]
    out = {"main": main}
    for t in rbf:
        out[rbf_measure(t)] = {**cka, "kernel": f"rbf:{t:g}"}
    return out


def measure_block(atlas: Any, measure: str, a: str, b: str) -> np.ndarray:
    """Model a's layers (rows) against model b's of one measure, read from ``atlas``: CKA and
    the CKA RBF measures are its matrix, ``hsic`` its HSIC, the rest ``matrix(measure=)``."""
    if measure == "hsic":
        return np.asarray(atlas.hsic_block(a, b), dtype=np.float64)
    if measure == "cka" or measure.startswith("cka_rbf_"):
        return np.asarray(atlas.matrix(a, b), dtype=np.float64)
    return np.asarray(atlas.matrix(a, b, measure=measure), dtype=np.float64)


@dataclass(frozen=True)
class Identification:
    """One measure's accuracy, its bootstrap interval and what it was computed over."""

    measure: str
    accuracy: float | None
    low: float | None
    high: float | None
    models: int
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "accuracy": self.accuracy,
            "low": self.low,
            "high": self.high,
            "models": self.models,
            "rows": self.rows,
        }


def hits(sims: np.ndarray) -> np.ndarray:
    """Scores (K, K, L): 1 where i:ℓ's best match in model j is j:ℓ, 1/t for a t-way tie that
    includes it, 0 otherwise; NaN on the diagonal i = j and for rows without a finite cell."""
    sims = np.asarray(sims, dtype=np.float64)
    if sims.ndim != 4 or sims.shape[0] != sims.shape[1] or sims.shape[2] != sims.shape[3]:
        raise ValueError(f"similarities must have shape (K, K, L, L), not {sims.shape}")
    k = sims.shape[0]
    finite = np.isfinite(sims)
    values = np.where(finite, sims, -np.inf)
    best = values.max(axis=3, keepdims=True)
    winners = finite & (values == best)
    own = np.diagonal(winners, axis1=2, axis2=3)  # (K, K, L): does layer ℓ share the maximum?
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = np.where(own, 1.0 / winners.sum(axis=3), 0.0)
    scores[~finite.any(axis=3)] = np.nan
    scores[np.arange(k), np.arange(k)] = np.nan
    return scores


def identification(
    measure: str,
    sims: np.ndarray,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> Identification:
    """The accuracy of ``measure`` over ``sims`` (K, K, L, L) and its interval (module doc)."""
    scores = hits(sims)
    k = scores.shape[0]
    answered = np.isfinite(scores)
    total = np.where(answered, scores, 0.0).sum(axis=2)  # S[m, m']
    count = answered.sum(axis=2).astype(np.float64)  # N[m, m'] (0 on the diagonal)
    rows = int(count.sum())
    if rows == 0:
        return Identification(measure, None, None, None, k, 0)
    accuracy = float(total.sum() / count.sum())
    low = high = None
    if k >= 2 and resamples > 0:
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, k, size=(resamples, k))
        copies = np.zeros((resamples, k))
        np.add.at(copies, (np.arange(resamples)[:, None], draws), 1.0)
        weights = copies[:, :, None] * copies[:, None, :]  # c_m c_m'; S, N are 0 where m = m'
        num = (weights * total).sum(axis=(1, 2))
        den = (weights * count).sum(axis=(1, 2))
        kept = num[den > 0] / den[den > 0]
        if kept.size:
            tail = 100.0 * (1.0 - level) / 2.0
            low, high = (float(v) for v in np.percentile(kept, [tail, 100.0 - tail]))
    return Identification(measure, accuracy, low, high, k, rows)


def similarities(atlas: Any, measure: str, names: Sequence[str]) -> np.ndarray:
    """(K, K, L, L): the blocks of ``measure`` between the models ``names`` (NaN where i = j)."""
    k = len(names)
    blocks = {
        (i, j): measure_block(atlas, measure, names[i], names[j])
        for i in range(k)
        for j in range(k)
        if i != j
    }
    shapes = {b.shape for b in blocks.values()}
    if len(shapes) > 1 or any(len(s) != 2 or s[0] != s[1] for s in shapes):
        raise ValueError(f"the models' layers differ ({sorted(shapes)}): one architecture only")
    size = shapes.pop()[0] if shapes else 0
    out = np.full((k, k, size, size), np.nan)
    for (i, j), block in blocks.items():
        out[i, j] = block
    return out


def score(
    names: Sequence[str],
    atlases: Mapping[str, Any],
    measures: Sequence[str],
    rbf: Sequence[float],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """summary.json's ``identification``: every measure of the ``main`` atlas (``measures``),
    then CKA RBF at each bandwidth multiplier of ``rbf`` (its atlas named
    :func:`rbf_measure`), each :meth:`Identification.as_dict` over the models ``names``."""
    wanted = [(m, atlases["main"]) for m in measures]
    wanted += [(rbf_measure(t), atlases[rbf_measure(t)]) for t in rbf]
    return [
        identification(m, similarities(atlas, m, names), resamples=resamples, seed=seed).as_dict()
        for m, atlas in wanted
    ]


def identification_table(items: Sequence[Mapping[str, Any]]) -> Any:
    """summary.json's ``identification`` as a pandas DataFrame (identification.csv)."""
    import pandas as pd

    columns = ["measure", "accuracy", "low", "high", "models", "rows"]
    return pd.DataFrame([{c: item.get(c) for c in columns} for item in items], columns=columns)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100.0 * value:.1f} %"


def markdown_table(items: Sequence[Mapping[str, Any]]) -> str:
    """summary.json's ``identification`` as a Markdown table (identification.md)."""
    lines = ["| measure | accuracy | 95 % interval (models resampled) |", "|---|---:|---:|"]
    for item in items:
        interval = (
            "—"
            if item.get("low") is None
            else f"[{_percent(item['low'])}, {_percent(item['high'])}]"
        )
        lines.append(f"| {item['measure']} | {_percent(item.get('accuracy'))} | {interval} |")
    return "\n".join(lines) + "\n"
