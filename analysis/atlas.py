"""The result of a comparison: accumulated HSIC for every layer pair, and CKA derived from it.

An :class:`Atlas` stores one symmetric float64 HSIC matrix over the layers of all models
(model by model, in ``models`` order); every CKA matrix is a block of the CKA computed from
it, so ``matrix(b, a)`` is exactly ``matrix(a, b).T`` and a model's block with itself is
included. ``to_dict`` gives plain JSON (``None`` where a value is undefined or not finite):

``hsic``, ``ci_low``, ``ci_high``
    the full (L_total, L_total) arrays (the intervals only with ``bootstrap``); the truth
    that :meth:`Atlas.from_dict` reads back.
``matrices``
    for every ordered model pair ``(a, b)`` with ``a`` at or before ``b`` in ``models``:
    ``{"a", "b", "cka", "ci_low", "ci_high"}``, rows the layers of ``a``; derived, for readers.
``self_hsic``
    per model, the diagonal of ``hsic`` for its layers.

What the batch statistics add is kept in :attr:`Atlas.values` by the names their modules
declare (:class:`analysis.batch_statistics.protocol.Output`, gathered in
:data:`analysis.batch_statistics.registry.OUTPUTS`), and written and read by those declarations;
today they are these, present only when computed (so an atlas without them serialises as before):

``p_value``, ``null_mean``, ``null_q95``
    (L_total, L_total) permutation-null summaries (the analytic null by default, see
    :mod:`analysis.inference.analytic_null`; ``compare(..., permutations=P)``, see
    :mod:`analysis.inference.permutation_null`); the ``matrices`` entries then carry their blocks
    too.
``p_draws``, ``p_method``
    with them: the permutations behind each p-value (0 for none) and what it rests on,
    ``analytic``, ``monte_carlo``, ``bound`` or ``permutation`` (``None`` where p is
    undefined; see :class:`analysis.inference.permutation_null.NullSummary`).
``effective_dim``, ``top_pc_share``
    per model, per layer: the minibatch participation ratio of the centred Gram and the share
    of its top component (:mod:`analysis.estimators.spectrum`): with ``sensitivity=True`` the share
    of the whole sample's top principal direction, else a batch average.
``cka_without_top_pc``
    (L_total, L_total), ``sensitivity=True``: CKA with the *row* layer's top direction removed.
``q_value``
    (L_total, L_total) with a null: Benjamini–Hochberg over the atlas's cells
    (:func:`analysis.inference.verdicts.atlas_q_values`); derived, for readers.
``baselines``
    with ``baselines=...`` (:mod:`analysis.comparison.baselines`,
    :mod:`analysis.comparison.seed_ceiling`): per baseline its full matrices (``random_init``:
    ``cka`` the mean over the draws, ``sd``, ``min``, ``max``, ``draws``, ``seeds``;
    ``seed_ceiling``: ``cka`` and, with intervals, ``ci_low``/``ci_high``) and per block what
    stood in, or the ``reason`` it is undefined; ``image_var``, where the comparison kept its
    cells' per-image projections, each cell's paired image variance of its difference from the
    baseline (:mod:`analysis.inference.verdicts`).
``measures``, and its flags ``cca_degenerate``, ``linreg_saturated``, ``procrustes_saturated``, …
    with ``measures`` beyond CKA (:mod:`analysis.measures`): per measure its full
    (L_total, L_total) matrix, whose blocks the ``matrices`` entries carry under the measure's
    name; per flag the computed measures declare (:data:`analysis.measures.FLAGS`), per cell
    whether it is raised there (``cca_degenerate`` with a CCA-family measure: :meth:`flagged`).
``verdicts``
    with baselines and intervals: each cell's difference from its baselines with its interval
    and verdict (:func:`analysis.inference.verdicts.cell_verdicts`, the arrays of
    :data:`analysis.inference.verdicts.VERDICT_KEYS`, with the ``margin``, ``level`` and
    ``verdict_images``: per question ``paired`` or ``summed``); derived.

Warnings about these (a list of sentences) and their structured flags live in
``diagnostics["warnings"]`` and ``diagnostics["flags"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.batch_statistics import registry
from analysis.batch_statistics.pair_image_terms import decode_pairs, encode_pairs
from analysis.batch_statistics.protocol import Output, OutputKind
from analysis.estimators.hsic import cka_from_hsic
from analysis.inference.permutation_null import NullSummary
from analysis.inference.verdicts import (
    LEVEL,
    MARGIN,
    atlas_q_values,
    cell_verdicts,
    verdict_images,
    verdicts_json,
)
from analysis.measures.registry import flags_of

__all__ = ["Atlas"]

FORMAT = "cka-atlas/1"


def _to_json(a: np.ndarray) -> list[Any]:
    return [[float(v) if np.isfinite(v) else None for v in row] for row in a]


def _from_json(rows: list[list[float | None]] | None) -> np.ndarray | None:
    if rows is None:
        return None
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


@dataclass(eq=False)
class Atlas:
    """CKA between every layer pair of every model pair, with its raw HSIC and provenance."""

    models: list[str]
    layers: dict[str, list[str]]
    hsic: np.ndarray
    n: int
    config: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    # what the batch statistics add, by their declared outputs' names
    # (analysis.batch_statistics.registry.OUTPUTS; a grouped one as "<name>/<member>")
    values: dict[str, np.ndarray] = field(default_factory=dict)
    baselines: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.hsic = np.asarray(self.hsic, dtype=np.float64)
        self.cka = cka_from_hsic(self.hsic)
        self._offsets: dict[str, slice] = {}
        start = 0
        for name in self.models:
            self._offsets[name] = slice(start, start + len(self.layers[name]))
            start += len(self.layers[name])
        if self.hsic.shape != (start, start):
            raise ValueError(f"hsic has shape {self.hsic.shape}; the layers need {(start, start)}")
        # per margin and the baselines and intervals they were computed from (which a caller,
        # add_baselines say, may set after construction)
        self._verdicts: dict[float, tuple[Any, Any, dict[str, np.ndarray]]] = {}

    # The statistics' outputs under the names the rest of the library reads them by.
    @property
    def ci_low(self) -> np.ndarray | None:
        """(L_total, L_total) lower ends of the cells' 95 % intervals, None without them."""
        return self.values.get("ci_low")

    @property
    def ci_high(self) -> np.ndarray | None:
        """(L_total, L_total) upper ends of the cells' 95 % intervals, None without them."""
        return self.values.get("ci_high")

    @property
    def null(self) -> NullSummary | None:
        """The cells' null summary (p-values, null means and quantiles), None without one."""
        v = self.values
        if not {"p_value", "null_mean", "null_q95"} <= set(v):
            return None
        return NullSummary(
            v["p_value"], v["null_mean"], v["null_q95"], v.get("p_draws"), v.get("p_method")
        )

    @property
    def layer_effective_dim(self) -> np.ndarray | None:
        return self.values.get("effective_dim")

    @property
    def layer_top_share(self) -> np.ndarray | None:
        return self.values.get("top_pc_share")

    @property
    def cka_drop(self) -> np.ndarray | None:
        return self.values.get("cka_without_top_pc")

    @property
    def measures(self) -> dict[str, np.ndarray] | None:
        """Per whole-sample measure beside CKA, its (L_total, L_total) matrix; None without."""
        return _group(self.values, "measures")

    @property
    def cca_flags(self) -> np.ndarray | None:
        """(L_total, L_total) booleans: CCA degenerate there; None without a CCA measure."""
        return self.values.get("cca_degenerate")

    def _check(self, *names: str) -> None:
        for name in names:
            if name not in self._offsets:
                raise KeyError(f"no model {name!r} in this atlas; it has {self.models}")

    def _block(self, full: np.ndarray, a: str, b: str) -> np.ndarray:
        self._check(a, b)
        return full[self._offsets[a], self._offsets[b]].copy()

    def matrix(self, a: str, b: str | None = None, measure: str = "cka") -> np.ndarray:
        """CKA (or ``measure``, one the comparison computed: :attr:`measure_names`) with rows
        the layers of ``a`` and columns those of ``b`` (default ``a``); NaN where undefined
        (see ``diagnostics["undefined_layers"]``)."""
        if measure == "cka":
            return self._block(self.cka, a, a if b is None else b)
        if measure not in (self.measures or {}):
            raise KeyError(
                f"no measure {measure!r} in this atlas; it has {', '.join(self.measure_names)}"
            )
        return self._block((self.measures or {})[measure], a, a if b is None else b)

    @property
    def measure_names(self) -> list[str]:
        """The measures this atlas has: ``cka``, then those computed beside it."""
        return ["cka", *(self.measures or {})]

    def cca_degenerate(self, a: str, b: str | None = None) -> np.ndarray | None:
        """Per cell, whether CCA is degenerate there (some canonical correlations are 1
        whatever the data, docs/measures.md); None without a CCA-family measure."""
        return self._optional(self.cca_flags, a, b)

    def flagged(self, measure: str, a: str, b: str | None = None) -> dict[str, np.ndarray]:
        """Per flag ``measure`` declares that this atlas carries (:mod:`analysis.measures`), its
        cells of (a, b): True where it is raised; empty for CKA and for a measure without."""
        out = {}
        for flag in flags_of(measure):
            if (full := self.values.get(flag.name)) is not None:
                out[flag.name] = self._block(full, a, a if b is None else b)
        return out

    def hsic_block(self, a: str, b: str | None = None) -> np.ndarray:
        """The accumulated HSIC terms behind :meth:`matrix` (summed over batches)."""
        return self._block(self.hsic, a, a if b is None else b)

    def self_hsic(self, name: str) -> np.ndarray:
        """Accumulated HSIC(K, K) of each layer of model ``name``."""
        return np.diag(self.hsic_block(name)).copy()

    def interval(self, a: str, b: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The bootstrap 95 % percentile interval (low, high) per cell, or None without one."""
        if self.ci_low is None or self.ci_high is None:
            return None
        b = a if b is None else b
        return self._block(self.ci_low, a, b), self._block(self.ci_high, a, b)

    def _optional(self, full: np.ndarray | None, a: str, b: str | None) -> np.ndarray | None:
        return None if full is None else self._block(full, a, a if b is None else b)

    def p_values(self, a: str, b: str | None = None) -> np.ndarray | None:
        """Permutation p-value per cell (``(1 + #{null ≥ observed}) / (1 + P)``), or None."""
        return self._optional(None if self.null is None else self.null.p_value, a, b)

    def p_draws(self, a: str, b: str | None = None) -> np.ndarray | None:
        """Permutations behind each cell's p-value (0: none, it comes from the exact moments),
        or None without a null."""
        return self._optional(None if self.null is None else self.null.p_draws, a, b)

    def p_method(self, a: str, b: str | None = None) -> np.ndarray | None:
        """What each cell's p-value rests on (``analytic``: the Pearson type III fitted to the
        exact moments; ``monte_carlo``: sequential within-batch permutations, ``p_draws`` of
        them; ``bound``: the exact moments' tail bound; ``permutation``: the brute-force null;
        "" where p is undefined), or None without a null."""
        return self._optional(None if self.null is None else self.null.p_method, a, b)

    def null_mean(self, a: str, b: str | None = None) -> np.ndarray | None:
        """Mean null CKA per cell (what shuffled samples give), or None without a null."""
        return self._optional(None if self.null is None else self.null.null_mean, a, b)

    def null_q95(self, a: str, b: str | None = None) -> np.ndarray | None:
        """95 % quantile of the null CKA per cell, or None without a null."""
        return self._optional(None if self.null is None else self.null.null_q95, a, b)

    def q_values(self, a: str, b: str | None = None) -> np.ndarray | None:
        """Benjamini–Hochberg q-value per cell over every cell of the atlas (each pair of
        distinct layers one test; NaN for a layer with itself), or None without a null."""
        return self._optional(self._q_full(), a, b)

    def _q_full(self) -> np.ndarray | None:
        return atlas_q_values(None if self.null is None else self.null.p_value)

    def _baseline_full(self, name: str, key: str = "cka") -> np.ndarray | None:
        stored = (self.baselines or {}).get(name) or {}
        return _from_json(stored.get(key))

    def baseline(self, name: str, a: str, b: str | None = None) -> np.ndarray | None:
        """The baseline ``name`` per cell (``random_init``: the twins' mean over their draws;
        ``seed_ceiling``), NaN where its block is undefined; None when not computed."""
        return self._optional(self._baseline_full(name), a, b)

    def baseline_sd(self, a: str, b: str | None = None) -> np.ndarray | None:
        """The random-init twins' standard deviation over their draws, per cell (NaN with one
        draw); None without the random-init baseline."""
        return self._optional(self._baseline_full("random_init", "sd"), a, b)

    def undefined_baselines(self, a: str, b: str | None = None) -> dict[str, str]:
        """Per baseline undefined for the block (a, b), why (no baseline compares a model with
        itself; see :func:`analysis.comparison.baselines.choose`)."""
        b = a if b is None else b
        self._check(a, b)
        out = {}
        for name, stored in (self.baselines or {}).items():
            for item in stored.get("blocks") or ():
                if "reason" in item and {item["a"], item["b"]} == {a, b}:
                    out[name] = item["reason"]
        return out

    def _verdicts_full(self, margin: float = MARGIN) -> dict[str, np.ndarray]:
        cached = self._verdicts.get(margin)
        if cached is None or cached[0] is not self.baselines or cached[1] is not self.ci_low:
            floor, ceiling = self._baseline_full("random_init"), self._baseline_full("seed_ceiling")
            draws = int(((self.baselines or {}).get("random_init") or {}).get("draws") or 0)
            computed = cell_verdicts(
                self.cka,
                self.ci_low,
                self.ci_high,
                random_init=None
                if floor is None
                else (floor, self._baseline_full("random_init", "sd"), draws),
                seed_ceiling=None
                if ceiling is None
                else (
                    ceiling,
                    self._baseline_full("seed_ceiling", "ci_low"),
                    self._baseline_full("seed_ceiling", "ci_high"),
                ),
                learned_images=self._baseline_full("random_init", "image_var"),
                seed_images=self._baseline_full("seed_ceiling", "image_var"),
                margin=margin,
            )
            cached = self._verdicts[margin] = (self.baselines, self.ci_low, computed)
        return cached[2]

    def verdicts(
        self, a: str, b: str | None = None, *, margin: float = MARGIN
    ) -> dict[str, np.ndarray] | None:
        """Both verdicts of each cell of the block, where its baselines exist: ``learned``
        (CKA minus the untrained twins' mean) with ``learned_low``/``learned_high`` and
        ``learned_verdict`` (``above_untrained | not_above_untrained | undecided``), and
        ``seed_gap`` (CKA minus the seed ceiling) with its bounds and ``seed_verdict``
        (``within_seed_spread | below_seed_ceiling | undecided``); verdicts are strings, None
        where a cell has none. None without baselines or intervals. ``margin``: how wide an
        interval may reach past 0 and still decide (:mod:`analysis.inference.verdicts`)."""
        full = self._verdicts_full(margin)
        if not full:
            self._check(a, a if b is None else b)
            return None
        b = a if b is None else b
        return {key: self._block(values, a, b) for key, values in full.items()}

    def verdict_images(self) -> dict[str, str]:
        """Per question the verdicts answer (``learned``, ``seed``), whether the image part of
        its difference's variance is ``paired`` (the baseline's per-cell ``image_var``, over
        the same images) or ``summed`` (:mod:`analysis.inference.verdicts`); empty without
        verdicts."""
        return verdict_images(
            self._verdicts_full(),
            self._baseline_full("random_init", "image_var"),
            self._baseline_full("seed_ceiling", "image_var"),
        )

    def _per_layer(self, full: np.ndarray | None, name: str) -> np.ndarray | None:
        if full is None:
            return None
        self._check(name)
        return full[self._offsets[name]].copy()

    def image_terms(self, a: str, b: str) -> np.ndarray | None:
        """Each image's first-order projection of the mean diagonal CKA of models a and b
        (:mod:`analysis.inference.paired_images`), None where the atlas kept none."""
        full = self.values.get("image_terms")
        if full is None or a == b:
            return None
        terms = full[self.models.index(a), self.models.index(b)]
        return terms if terms.size and np.isfinite(terms).all() else None

    def effective_dim(self, name: str) -> np.ndarray | None:
        """Per layer of ``name``: participation ratio of the centred Gram, batch average."""
        return self._per_layer(self.layer_effective_dim, name)

    def top_pc_share(self, name: str) -> np.ndarray | None:
        """Per layer of ``name``: share of the variance in the top component (of the whole
        sample with ``sensitivity=True``, else a batch average)."""
        return self._per_layer(self.layer_top_share, name)

    def without_top_pc(self, a: str, b: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """CKA with ``a``'s layer's top direction removed, and with ``b``'s; None unless
        computed (``sensitivity=True``)."""
        if self.cka_drop is None:
            return None
        b = a if b is None else b
        return self._block(self.cka_drop, a, b), self._block(self.cka_drop, b, a).T

    def sensitivity(self, a: str, b: str | None = None) -> np.ndarray | None:
        """Per cell, the larger move of CKA when either side's top direction is removed."""
        drop = self.without_top_pc(a, b)
        if drop is None:
            return None
        cka = self.matrix(a, b)
        shift: np.ndarray = np.fmax(np.abs(drop[0] - cka), np.abs(drop[1] - cka))
        return shift

    @property
    def warnings(self) -> list[str]:
        """One sentence per thing to be careful about (see ``flags`` for the structured form)."""
        return list(self.diagnostics.get("warnings", []))

    @property
    def flags(self) -> list[dict[str, Any]]:
        """The structured form of :attr:`warnings`: a dict per flagged layer or cell."""
        return list(self.diagnostics.get("flags", []))

    def pairs(self) -> list[tuple[str, str]]:
        """Every model pair (a, b) with a at or before b, the order ``to_dict`` uses."""
        return [(a, b) for i, a in enumerate(self.models) for b in self.models[i:]]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; :meth:`from_dict` restores an equal atlas. The statistics'
        outputs are written as their declarations say (:class:`Output`)."""
        matrices = []
        for a, b in self.pairs():
            entry: dict[str, Any] = {"a": a, "b": b, "cka": _to_json(self.matrix(a, b))}
            for output in registry.OUTPUTS:
                if output.blocks:
                    entry |= self._output_json(output, a, b)
            matrices.append(entry)
        out = {
            "format": FORMAT,
            "models": list(self.models),
            "layers": {m: list(self.layers[m]) for m in self.models},
            "n": int(self.n),
            "config": self.config,
            "hsic": _to_json(self.hsic),
            "self_hsic": {m: _to_json(self.self_hsic(m)[None])[0] for m in self.models},
            "matrices": matrices,
            "diagnostics": self.diagnostics,
        }
        for output in registry.OUTPUTS:
            if output.grouped:
                if (group := _group(self.values, output.name)) is not None:
                    out[output.name] = {k: self._encode(output, v) for k, v in group.items()}
            elif (value := self.values.get(output.name)) is not None:
                out[output.name] = self._encode(output, value)
            elif output.always:
                out[output.name] = None
        q = self._q_full()
        if q is not None:
            out["q_value"] = _to_json(q)
        if self.baselines is not None:
            out["baselines"] = self.baselines
            if verdicts := self._verdicts_full():
                out["verdicts"] = verdicts_json(
                    verdicts, margin=MARGIN, level=LEVEL, images=self.verdict_images()
                )
        return out

    def _output_json(self, output: Output, a: str, b: str) -> dict[str, Any]:
        """``output``'s block of the pair (a, b) as JSON, under its name (a grouped output:
        each member's under the member's name)."""
        if output.grouped:
            group = _group(self.values, output.name) or {}
            return {k: _encode(output.kind, self._block(v, a, b)) for k, v in group.items()}
        value = self.values.get(output.name)
        if value is None:
            return {output.name: None} if output.always else {}
        return {output.name: _encode(output.kind, self._block(value, a, b))}

    def _encode(self, output: Output, value: np.ndarray) -> Any:
        if output.kind == "layers":  # per model, its layers' values
            return {m: _encode("layers", value[self._offsets[m]]) for m in self.models}
        if output.kind == "images":  # per model pair, its images' values
            return encode_pairs(value)
        return _encode(output.kind, value)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Atlas:
        """Rebuild an atlas from :meth:`to_dict` output (or its JSON, parsed)."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} atlas (format {data.get('format')!r})")
        hsic = _from_json(data["hsic"])
        assert hsic is not None
        values: dict[str, np.ndarray] = {}
        for output in registry.OUTPUTS:
            found = data.get(output.name)
            if found is None:
                continue
            if output.grouped:
                for k, rows in found.items():
                    if rows is not None:
                        values[f"{output.name}/{k}"] = _decode(output.kind, rows)
            elif output.kind == "layers":
                values[output.name] = _decode(
                    "layers", [v for m in data["models"] for v in found[m]]
                )
            elif output.kind == "images":
                values[output.name] = decode_pairs(len(data["models"]), found)
            else:
                values[output.name] = _decode(output.kind, found)
        return cls(
            models=list(data["models"]),
            layers={m: list(v) for m, v in data["layers"].items()},
            hsic=hsic.reshape(sum(len(v) for v in data["layers"].values()), -1),
            n=int(data["n"]),
            config=dict(data["config"]),
            diagnostics=dict(data["diagnostics"]),
            values=values,
            baselines=data.get("baselines"),
        )


def _group(values: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray] | None:
    """The members of the grouped output ``name`` (values ``"<name>/<member>"``), or None."""
    prefix = f"{name}/"
    found = {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
    return found or None


def _encode(kind: OutputKind, value: np.ndarray) -> Any:
    """An output's array as JSON (:data:`analysis.batch_statistics.protocol.OutputKind`)."""
    if kind == "labels":
        return [[str(v) if v else None for v in row] for row in value]
    if kind == "flags":
        return [[bool(v) for v in row] for row in value]
    if kind == "layers":
        return [float(v) if np.isfinite(v) else None for v in value]
    return _to_json(np.asarray(value, dtype=np.float64))  # cells and counts


def _decode(kind: OutputKind, rows: Any) -> np.ndarray:
    """:func:`_encode`'s inverse."""
    if kind == "labels":
        return np.array([[v or "" for v in row] for row in rows], object)
    if kind == "flags":
        return np.array(rows, dtype=bool)
    if kind == "layers":
        return np.array([np.nan if v is None else v for v in rows], dtype=np.float64)
    full = _from_json(rows)
    assert full is not None
    return np.nan_to_num(full).astype(np.int64) if kind == "counts" else full
