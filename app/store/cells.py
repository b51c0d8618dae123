"""The cells of a stored atlas: per-pair blocks of every per-cell quantity, the long table, and
the model-level summary.

A finished comparison's ``result`` holds the CKA blocks of every model pair (``matrices``) and,
when they were computed, full (L_total, L_total) arrays of the 95 % interval
(``ci_low``/``ci_high``; image-level unless ``config["interval"]`` is ``batches``), the
null (``p_value``/``null_mean``/``null_q95``, ``q_value``, the Benjamini–Hochberg q-value
over the comparison's cells, and ``p_method``, what each p-value rests on: ``analytic``,
``monte_carlo``, ``bound`` or ``permutation``, see :meth:`analysis.Atlas.p_method`; a result
stored without it has none, and the field is null), the baselines
(``baselines.random_init.cka`` with its spread over the draws ``.sd``, exported as
``random_init_sd``; ``baselines.seed_ceiling.cka``; an undefined
block's reason in ``baselines.*.blocks``), each cell's verdicts against them (``verdicts``: the
arrays of :data:`analysis.inference.verdicts.VERDICT_KEYS`) and CKA with the row layer's
whole-sample top principal component removed (``cka_without_top_pc``, with ``sensitivity``), all in
the atlas's layer order (model by model): the library's :meth:`analysis.Atlas.to_dict`. The q-values
and verdicts are read as the library stored them; a result stored before they were gets them from
the same functions (:mod:`analysis.inference.verdicts`). A cell's ``sensitivity`` is the larger move
of its CKA when either side's top component is removed. :class:`Cells` reads them once and slices
any of them for a model pair, so the matrix endpoint, the page and the exports agree cell for
cell.

The long table has one row per cell of every model pair (a, b) with a at or before b in the
comparison's order (a model's block with itself included), the order of ``matrices``:
:data:`COLUMNS`, NaN where a quantity was not computed or is undefined; a comparison with other
measures than CKA (``measures``, with ``cca_degenerate`` per cell for the CCA family) repeats
the rows once per measure, named in ``measure``; the column ``flags`` (before the verdicts)
names the flags of that measure raised at the cell (:data:`analysis.measures.FLAGS`, ``;``
between two; empty where none is).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.inference.verdicts import (
    MARKS,
    VERDICT_KEYS,
    WORDS,
    atlas_q_values,
    cell_verdicts,
    verdict_images,
    verdicts_from_json,
)
from analysis.measures import FLAGS, flags_of

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLUMNS",
    "QUANTITIES",
    "SIGNIFICANCE",
    "VERDICT_LEGEND",
    "Cells",
    "PairSummary",
    "formula_safe",
    "probability_text",
    "verdict_marks",
]

# Per-cell quantities besides CKA, in the order of the table's columns.
QUANTITIES = (
    "ci_low",
    "ci_high",
    "p_value",
    "q_value",
    "null_mean",
    "null_q95",
    "p_method",
    "random_init",
    "random_init_sd",
    "seed_ceiling",
    "sensitivity",
    *VERDICT_KEYS,
)
# ``measure`` names what ``value`` is: a CKA row (its ``cka`` and company repeated in ``value``)
# or one of the comparison's other measures (analysis.measures; CKA's columns empty there).
COLUMNS = (
    "model_a",
    "layer_a",
    "model_b",
    "layer_b",
    "measure",
    "value",
    "cca_degenerate",
    "cka",
    *(key for key in QUANTITIES if key not in VERDICT_KEYS),
    "flags",  # the measure's flags raised at the cell (analysis.measures.FLAGS)
    *VERDICT_KEYS,
)
LABEL_COLUMNS = ("model_a", "layer_a", "model_b", "layer_b")
# Quantities that are words per cell (object arrays: a string, or None where there is none).
WORD_QUANTITIES = ("p_method", *(k for k in VERDICT_KEYS if k.endswith("_verdict")))
# A spreadsheet reads a cell that starts with one of these as a formula (OWASP, CSV injection).
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")


def formula_safe(text: str) -> str:
    """``text`` with a ``'`` in front if a spreadsheet would run it as a formula."""
    return f"'{text}" if text.startswith(FORMULA_LEADS) else text


# Below this q-value (false discovery rate) a cell is told apart from the null; the page
# hatches the rest.
SIGNIFICANCE = 0.05


def _array(rows: Any) -> np.ndarray | None:
    if rows is None:
        return None
    return np.array(
        [[np.nan if v is None else float(v) for v in row] for row in rows], dtype=np.float64
    ).reshape(len(rows), -1)


def _jsonable(a: np.ndarray | None) -> list[list[Any]] | None:
    if a is None:
        return None
    if a.dtype == object:  # verdicts, p_method: a string or None
        return [[v if isinstance(v, str) else None for v in row] for row in a]
    return [[float(v) if np.isfinite(v) else None for v in row] for row in a]


def _words(rows: Any) -> np.ndarray | None:
    """Per-cell words stored as JSON rows (a string or null) as an object array."""
    if rows is None:
        return None
    return np.array([[v or None for v in row] for row in rows], dtype=object).reshape(len(rows), -1)


def _flag_names(raised: dict[str, np.ndarray], size: int) -> list[str | None]:
    """Per cell of a block (row-major), the names of the flags raised there joined by ``;``,
    or None where none is."""
    names: list[list[str]] = [[] for _ in range(size)]
    for name, block in raised.items():
        for cell in np.flatnonzero(block):
            names[cell].append(name)
    return [";".join(found) or None for found in names]


def _mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


# What the marks say, once: "▲ above untrained twins, ▽ ..., ? undecided (...)".
VERDICT_LEGEND = (
    ", ".join(f"{MARKS[q][v]} {WORDS[q][v]}" for q in MARKS for v in MARKS[q] if v != "undecided")
    + ", ? undecided (the interval is too wide to tell); each mark counts the cells averaged"
)


def probability_text(v: float | None) -> str:
    """A p- or q-value as every view writes it (the command line, the page's tooltip, whose
    ``formatP`` in heatmap.js follows the same rule): three decimals; below 0.001 its order of
    magnitude (``3e-05``: the analytic null reaches far smaller values than a count of
    permutations can); below 1e-300 ``<1e-300`` (it reaches 0 in float64); ``-`` for none."""
    if v is None:
        return "-"
    if v >= 1e-3:
        return f"{v:.3f}"
    return "<1e-300" if v < 1e-300 else f"{v:.0e}"


def verdict_marks(counts: dict[str, int], question: str) -> str:
    """A pair's verdicts as marks with their counts over its summarised cells, decided first
    (``"▲7"``, ``"▽2 ?5"``, see :data:`analysis.inference.verdicts.MARKS`); "" without any."""
    marks = MARKS[question]
    return " ".join(f"{marks[v]}{counts[v]}" for v in marks if counts.get(v))


@dataclass(frozen=True)
class PairSummary:
    """One model pair in a number: the mean same-depth (diagonal) CKA when both models have as
    many layers, else the mean over ``a``'s layers of the best match among ``b``'s.

    ``ci_low``/``ci_high`` average the cells' own interval bounds: wider than the interval of
    the mean itself (bounds of a mean of correlated cells are at most the mean of bounds);
    ``random_init_sd`` likewise averages the cells' standard deviations over the draws.
    """

    a: str
    b: str
    kind: str  # "diagonal" | "best match"
    cka: float | None
    ci_low: float | None
    ci_high: float | None
    max_p_value: float | None  # the largest p over the cells averaged
    max_q_value: float | None  # the largest q (false discovery rate) over them
    random_init: float | None
    random_init_sd: float | None  # the cells' spreads over the twins' draws, averaged
    seed_ceiling: float | None
    undefined: dict[str, str]  # baseline -> why the pair has none
    learned: float | None = None  # the cells' CKA minus the twins' mean, averaged
    learned_verdicts: dict[str, int] | None = None  # per verdict, how many of the cells
    seed_gap: float | None = None  # the cells' CKA minus the seed ceiling, averaged
    seed_verdicts: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Cells:
    """Every per-cell quantity of one stored atlas, sliceable by model pair."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.models: list[str] = list(result["models"])
        self.layers: dict[str, list[str]] = {m: list(result["layers"][m]) for m in self.models}
        self._slices: dict[str, slice] = {}
        start = 0
        for m in self.models:
            self._slices[m] = slice(start, start + len(self.layers[m]))
            start += len(self.layers[m])
        cka = np.full((start, start), np.nan)
        for entry in result.get("matrices", []):
            block = _array(entry["cka"])
            assert block is not None
            sa, sb = self._slices[entry["a"]], self._slices[entry["b"]]
            cka[sb, sa] = block.T
            cka[sa, sb] = block
        self.full: dict[str, np.ndarray | None] = {"cka": cka}
        for key in ("ci_low", "ci_high", "p_value", "null_mean", "null_q95"):
            self.full[key] = _array(result.get(key))
        stored_q = _array(result.get("q_value"))
        self.full["q_value"] = (
            stored_q if stored_q is not None else atlas_q_values(self.full["p_value"])
        )
        self.full["p_method"] = _words(result.get("p_method"))  # None: stored before it was
        baselines = result.get("baselines") or {}
        for key in ("random_init", "seed_ceiling"):
            self.full[key] = _array((baselines.get(key) or {}).get("cka"))
        self.full["random_init_sd"] = _array((baselines.get("random_init") or {}).get("sd"))
        verdicts = (
            verdicts_from_json(result["verdicts"])
            if result.get("verdicts")
            else self._derived_verdicts(baselines)
        )
        for key in VERDICT_KEYS:
            self.full[key] = verdicts.get(key)
        # per question, whether its image term is paired or summed (analysis.inference.verdicts):
        # a result stored before verdicts said so summed them
        self.verdict_images: dict[str, str] = dict(
            (result.get("verdicts") or {}).get("verdict_images")
            or verdict_images(verdicts, None, None)
        )
        # Why a baseline block is undefined, per baseline and model pair (either order).
        self._reasons: dict[str, dict[tuple[str, str], str]] = {}
        for key, stored in baselines.items():
            for item in stored.get("blocks") or ():
                if "reason" in item:
                    pair = (item["a"], item["b"])
                    self._reasons.setdefault(key, {})[pair] = item["reason"]
                    self._reasons[key][pair[::-1]] = item["reason"]
        self.measures: dict[str, np.ndarray] = {
            name: full
            for name, rows in (result.get("measures") or {}).items()
            if (full := _array(rows)) is not None
        }
        # per flag of the measures (analysis.measures.FLAGS) the result carries, its cells
        self.flags: dict[str, np.ndarray] = {
            flag.name: np.array(result[flag.name], dtype=bool)
            for flag in FLAGS
            if result.get(flag.name) is not None
        }
        self.cca_flags = self.flags.get("cca_degenerate")
        drop = _array(result.get("cka_without_top_pc"))
        self.full["sensitivity"] = (
            None if drop is None else np.fmax(np.abs(drop - cka), np.abs(drop.T - cka))
        )

    def _derived_verdicts(self, baselines: dict[str, Any]) -> dict[str, np.ndarray]:
        """A result stored before verdicts were: the same function over its stored arrays
        (a ceiling stored without an interval counts the cell's own image noise twice)."""
        floor, ceiling, cka = self.full["random_init"], self.full["seed_ceiling"], self.full["cka"]
        assert cka is not None
        draws = int((baselines.get("random_init") or {}).get("draws") or 0)
        ceiling_json = baselines.get("seed_ceiling") or {}
        return cell_verdicts(
            cka,
            self.full["ci_low"],
            self.full["ci_high"],
            random_init=None if floor is None else (floor, self.full["random_init_sd"], draws),
            seed_ceiling=None
            if ceiling is None
            else (ceiling, _array(ceiling_json.get("ci_low")), _array(ceiling_json.get("ci_high"))),
        )

    def has(self, key: str) -> bool:
        """Whether ``key`` (a quantity of :data:`QUANTITIES` or ``cka``) was computed."""
        return self.full.get(key) is not None

    def block(self, key: str, a: str, b: str) -> np.ndarray | None:
        """Rows the layers of ``a``, columns those of ``b``; None when not computed."""
        full = self.full[key]
        return None if full is None else full[self._slices[a], self._slices[b]].copy()

    def blocks_json(self, a: str, b: str) -> dict[str, list[list[Any]] | None]:
        """Every quantity's block of (a, b) as JSON (null cells where undefined)."""
        return {key: _jsonable(self.block(key, a, b)) for key in ("cka", *QUANTITIES)}

    @property
    def measure_names(self) -> list[str]:
        """``cka``, then the other measures the comparison computed."""
        return ["cka", *self.measures]

    def measure_block(self, measure: str, a: str, b: str) -> np.ndarray:
        """Measure ``measure``'s block of (a, b) (one of :attr:`measure_names`)."""
        full = self.full["cka"] if measure == "cka" else self.measures[measure]
        assert full is not None
        return full[self._slices[a], self._slices[b]].copy()

    def measure_json(self, measure: str, a: str, b: str) -> list[list[Any]]:
        """:meth:`measure_block` as JSON (null cells where undefined)."""
        block = _jsonable(self.measure_block(measure, a, b))
        assert block is not None
        return block

    def degenerate_block(self, a: str, b: str) -> np.ndarray | None:
        """Per cell of (a, b), whether CCA is degenerate there; None without the CCA family."""
        if self.cca_flags is None:
            return None
        return self.cca_flags[self._slices[a], self._slices[b]].copy()

    def flags_block(self, measure: str, a: str, b: str) -> dict[str, np.ndarray]:
        """Per flag of ``measure`` the result carries, its cells of (a, b) (True: raised)."""
        return {
            flag.name: self.flags[flag.name][self._slices[a], self._slices[b]].copy()
            for flag in flags_of(measure)
            if flag.name in self.flags
        }

    def flags_json(self, measure: str, a: str, b: str) -> dict[str, list[list[bool]]]:
        """:meth:`flags_block` as JSON."""
        return {k: v.tolist() for k, v in self.flags_block(measure, a, b).items()}

    def undefined(self, a: str, b: str) -> dict[str, str]:
        """Per baseline undefined for the pair (a, b), the reason (see app.jobs.baselines)."""
        return {key: why[a, b] for key, why in self._reasons.items() if (a, b) in why}

    def pairs(self) -> list[tuple[str, str]]:
        """(a, b) with a at or before b: the pairs of the long table."""
        return [(a, b) for i, a in enumerate(self.models) for b in self.models[i:]]

    def columns(self) -> dict[str, Any]:
        """The long table as columns (lists of strings, float64 arrays)."""
        out: dict[str, list[Any]] = {name: [] for name in COLUMNS}
        for measure in self.measure_names:
            for a, b in self.pairs():
                la, lb = self.layers[a], self.layers[b]
                size = len(la) * len(lb)
                out["model_a"] += [a] * size
                out["layer_a"] += [layer for layer in la for _ in lb]
                out["model_b"] += [b] * size
                out["layer_b"] += list(lb) * len(la)
                out["measure"] += [measure] * size
                out["value"].append(self.measure_block(measure, a, b).ravel())
                raised = self.flags_block(measure, a, b)
                flags = raised.get("cca_degenerate")
                out["cca_degenerate"] += [None] * size if flags is None else flags.ravel().tolist()
                out["flags"] += _flag_names(raised, size)
                for key in ("cka", *QUANTITIES):
                    block = self.block(key, a, b) if measure == "cka" else None
                    empty = None if key in WORD_QUANTITIES else np.nan
                    values = np.full(size, empty) if block is None else block.ravel()
                    out[key].append(values)
        table: dict[str, Any] = {}
        for name in COLUMNS:
            parts = out[name]
            if name in (*LABEL_COLUMNS, "measure", "cca_degenerate", "flags"):
                table[name] = parts
            else:
                table[name] = np.concatenate(parts) if parts else np.zeros(0)
        return table

    def frame(self) -> pd.DataFrame:
        """The long table as a pandas DataFrame (strings and float64, NaN where missing)."""
        import pandas as pd

        cols = self.columns()
        return pd.DataFrame({name: cols[name] for name in COLUMNS})

    def export_frame(self) -> pd.DataFrame:
        """:meth:`frame` with its names made inert for spreadsheets (see :func:`formula_safe`)."""
        frame = self.frame()
        for name in LABEL_COLUMNS:
            frame[name] = [formula_safe(v) for v in frame[name]]
        return frame

    def to_csv(self) -> bytes:
        """The long table as CSV (UTF-8, a header row, empty fields where missing; floats are
        written in full so that reading them back gives the stored values)."""
        return self.export_frame().to_csv(index=False).encode()

    def to_parquet(self) -> bytes:
        """The long table as Parquet (pyarrow)."""
        buffer = io.BytesIO()
        self.export_frame().to_parquet(buffer, index=False, engine="pyarrow")
        return buffer.getvalue()

    def summary(self, a: str, b: str) -> PairSummary:
        """The pair's one-number summary (see :class:`PairSummary`)."""
        la, lb = self.layers[a], self.layers[b]
        cka = self.block("cka", a, b)
        assert cka is not None
        if len(la) == len(lb):
            kind = "diagonal"
            idx = (np.arange(len(la)), np.arange(len(lb)))
        else:
            kind = "best match"
            filled = np.where(np.isfinite(cka), cka, -np.inf)
            idx = (np.arange(len(la)), filled.argmax(1))

        def pick(key: str) -> np.ndarray | None:
            block = self.block(key, a, b)
            return None if block is None else block[idx]

        def mean(key: str) -> float | None:
            values = pick(key)
            return None if values is None else _mean(values)

        def largest(key: str) -> float | None:
            values = pick(key)
            finite = values[np.isfinite(values)] if values is not None else np.zeros(0)
            return float(finite.max()) if finite.size else None

        def counted(key: str) -> dict[str, int] | None:
            values = pick(key)
            if values is None:
                return None
            found = [v for v in values if isinstance(v, str)]
            return {v: found.count(v) for v in dict.fromkeys(found)} or None

        return PairSummary(
            a=a,
            b=b,
            kind=kind,
            cka=mean("cka"),
            ci_low=mean("ci_low"),
            ci_high=mean("ci_high"),
            max_p_value=largest("p_value"),
            max_q_value=largest("q_value"),
            random_init=mean("random_init"),
            random_init_sd=mean("random_init_sd"),
            seed_ceiling=mean("seed_ceiling"),
            undefined=self.undefined(a, b),
            learned=mean("learned"),
            learned_verdicts=counted("learned_verdict"),
            seed_gap=mean("seed_gap"),
            seed_verdicts=counted("seed_verdict"),
        )

    def summaries(self) -> list[list[dict[str, Any]]]:
        """The K×K model-level summary, rows and columns in the comparison's order."""
        return [[self.summary(a, b).to_dict() for b in self.models] for a in self.models]
