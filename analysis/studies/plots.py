"""The plot of a study, drawn from its summary dict alone (so a stored summary redraws it).

``cka_vs_density`` (the sparsity study): diagonal CKA against the reference, against density
on a log axis, for every entry with a density (SW-MLP points and the dense MLP at p = 1), with
the 95 % interval as a band; the reference's matched p = (1/S + 1/C)/2 as a vertical line; the
seed-to-seed baseline as a grey band; entries without a density (RP-Mixer, …) as dashed lines.

``accuracy_vs_width`` (the width study): test accuracy against effective width m (log axis),
one line per arm (family) with 95 % interval error bars.

``identification`` (the layer-identification study): one bar per measure, its accuracy with the
95 % interval over models as an error bar, and chance (1/L, L layers) as a dotted line.

Below the first two, when the summary has ``differences``: every arm's difference in diagonal
CKA from the arm at the reference's matched point (filled) and from the seed-to-seed baseline
(open), with the crossed-seed 95 % intervals; an interval clear of 0 is a decided difference.

matplotlib's object API only (no pyplot), deterministic bytes as :mod:`analysis.plot`.
"""

from __future__ import annotations

import io
from collections import defaultdict
from fractions import Fraction
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from analysis.plot import plain_text

__all__ = ["PLOT_KINDS", "render_plot", "render_plots"]

PLOT_KINDS = ("cka_vs_density", "accuracy_vs_width", "identification")
_METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
}


def _ci(stat: dict[str, Any]) -> tuple[float | None, float | None]:
    low, high = stat.get("ci") or [None, None]
    return low, high


def _fraction(p: float) -> str:
    frac = Fraction(p).limit_denominator(4096)
    return f"{frac.numerator}/{frac.denominator}" if frac.denominator > 1 else f"{p:g}"


def _density_plot(ax: Axes, summary: dict[str, Any]) -> None:
    points = [
        a
        for a in summary["arms"]
        if a["density"] is not None and a["cka_diagonal"]["mean"] is not None
    ]
    points.sort(key=lambda a: a["density"])
    xs = [a["density"] for a in points]
    ys = [a["cka_diagonal"]["mean"] for a in points]
    if points:
        ax.plot(xs, ys, "o-", color="C0", label="SW-MLP / MLP (diagonal CKA)")
        band: list[tuple[float, float, float]] = []
        for x, arm in zip(xs, points, strict=True):
            low, high = _ci(arm["cka_diagonal"])
            if low is not None and high is not None:
                band.append((x, low, high))
        if band:
            ax.fill_between(
                [b[0] for b in band],
                [b[1] for b in band],
                [b[2] for b in band],
                color="C0",
                alpha=0.2,
                label="95 % t over seed pairs (a spread)",
            )
    ref = summary["reference"]
    if ref.get("S") and ref.get("C"):
        matched = (1.0 / ref["S"] + 1.0 / ref["C"]) / 2.0
        ax.axvline(matched, color="C3", linestyle=":", label=f"matched p = {_fraction(matched)}")
    base = summary["baselines"]["seed_to_seed"]
    if base["mean"] is not None:
        ax.axhline(base["mean"], color="0.4", linewidth=1, label="seed to seed (reference)")
        low, high = _ci(base)
        if low is not None and high is not None:
            ax.axhspan(low, high, color="0.5", alpha=0.2)
    others = [
        a for a in summary["arms"] if a["density"] is None and a["cka_diagonal"]["mean"] is not None
    ]
    for i, arm in enumerate(others):
        color = f"C{(i + 4) % 10}"
        ax.axhline(arm["cka_diagonal"]["mean"], color=color, linestyle="--", label=arm["name"])
    _log2_axis(ax)
    ax.set_xlabel("density p of the SW-MLP (log scale)")
    ax.set_ylabel(f"mean diagonal CKA vs {ref['name']}")


def _width_plot(ax: Axes, summary: dict[str, Any]) -> None:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for arm in summary["arms"]:
        if arm["accuracy"]["mean"] is not None and arm["effective_width"]:
            groups[arm["arm"]].append(arm)
    for i, (group, arms) in enumerate(groups.items()):
        arms.sort(key=lambda a: a["effective_width"])
        xs = [a["effective_width"] for a in arms]
        ys = [a["accuracy"]["mean"] for a in arms]
        lower, upper = [], []
        for a, y in zip(arms, ys, strict=True):
            low, high = _ci(a["accuracy"])
            lower.append(0.0 if low is None else y - low)
            upper.append(0.0 if high is None else high - y)
        ax.errorbar(xs, ys, yerr=[lower, upper], fmt="o-", capsize=3, color=f"C{i}", label=group)
    _log2_axis(ax)
    omegas = sorted({a["omega"] for arms in groups.values() for a in arms})
    span = f"Ω {omegas[0]:,}–{omegas[-1]:,}" if omegas else "Ω"
    ax.set_xlabel(f"effective width m = S·C (log scale; {span})")
    ax.set_ylabel("test accuracy")


def _identification_plot(ax: Axes, summary: dict[str, Any]) -> None:
    items = [i for i in summary.get("identification") or [] if i.get("accuracy") is not None]
    xs = list(range(len(items)))
    ys = [100.0 * i["accuracy"] for i in items]
    below = [0.0 if i["low"] is None else 100.0 * (i["accuracy"] - i["low"]) for i in items]
    above = [0.0 if i["high"] is None else 100.0 * (i["high"] - i["accuracy"]) for i in items]
    ax.bar(xs, ys, color="C0", label="accuracy (95 % interval, models resampled)")
    ax.errorbar(xs, ys, yerr=[below, above], fmt="none", ecolor="black", capsize=3)
    layers = len(summary["baselines"]["seed_to_seed"].get("per_layer") or [])
    if layers:
        ax.axhline(100.0 / layers, color="C3", linestyle=":", label=f"chance (1/{layers} layers)")
    ax.set_xticks(xs, [i["measure"] for i in items], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0.0, 105.0)
    ax.set_ylabel("same-depth layer identified (%)")


def _log2_tick(value: float, _position: int) -> str:
    return f"{value:g}" if value >= 1 else f"1/{Fraction(1 / value).limit_denominator()}"


def _log2_axis(ax: Axes) -> None:
    """A base-2 log x axis labelled in plain text (1/64, 1/2, 1, 512): matplotlib's own log
    labels are math text, which every plot here turns off (names are never parsed as math)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(_log2_tick))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _differences_plot(ax: Axes, summary: dict[str, Any]) -> None:
    items = [d for d in summary["differences"] if d["estimate"] is not None]
    names = list(dict.fromkeys(d["arm"] for d in items))
    matched = summary.get("matched")
    styles = {"seed_to_seed": ("0.35", "white", "− seed to seed", 0.18)}
    seen: set[str] = set()
    for d in items:
        kind = "seed_to_seed" if d["versus"] == "seed_to_seed" else "matched"
        edge, face, label, shift = styles.get(kind, ("C3", "C3", f"− {matched}", -0.18))
        y = names.index(d["arm"]) + shift
        if d["low"] is not None:
            ax.plot([d["low"], d["high"]], [y, y], color=edge, linewidth=1.5)
        ax.plot(
            [d["estimate"]],
            [y],
            "o",
            markeredgecolor=edge,
            markerfacecolor=face,
            markersize=5,
            label=None if kind in seen else label,
        )
        seen.add(kind)
    ax.axvline(0.0, color="0.2", linewidth=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("difference in mean diagonal CKA (crossed-seed 95 % interval)")
    if seen:  # a study without differences (one arm, one seed) has nothing to label
        ax.legend(fontsize=7, loc="best")
    ax.grid(True, axis="x", alpha=0.3)


def render_plots(
    summary: dict[str, Any], formats: tuple[str, ...] = ("png", "svg"), *, dpi: int = 100
) -> dict[str, bytes]:
    """The study's plot (its ``plot`` kind) in each of ``formats`` ('png', 'svg'), drawn once.

    The constrained layout is computed once, before any file is written, and then kept, so
    every format has the same layout whichever others are asked for: the bytes of one format
    do not depend on the rest of ``formats``.
    """
    for fmt in formats:
        if fmt not in _METADATA:
            raise ValueError(f"study plots are 'png' or 'svg', not {fmt!r}")
    kind = summary.get("plot", "cka_vs_density")
    if kind not in PLOT_KINDS:
        raise ValueError(f"unknown study plot {kind!r}; use one of {PLOT_KINDS}")
    arms = len({d["arm"] for d in summary.get("differences") or []})
    height = 4.2 + (0.9 + 0.28 * arms if arms else 0.0)
    fig = Figure(figsize=(6.4, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    if arms:
        ax, lower = fig.subplots(2, 1, height_ratios=[4.2, height - 4.2])
        _differences_plot(lower, summary)
    else:
        ax = fig.subplots()
    if kind == "cka_vs_density":
        _density_plot(ax, summary)
    elif kind == "identification":
        _identification_plot(ax, summary)
    else:
        _width_plot(ax, summary)
    seeds = summary.get("seeds") or []
    dataset = (summary.get("dataset") or {}).get("name", "?")
    ax.set_title(f"{summary['study']} on {dataset}, {len(seeds)} seed(s)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    plain_text(fig)
    fig.draw_without_rendering()  # the layout, once
    fig.set_layout_engine("none")
    out = {}
    for fmt in formats:
        buf = io.BytesIO()
        with rc_context({"svg.hashsalt": "cka-atlas"}):
            fig.savefig(buf, format=fmt, metadata=_METADATA[fmt])
        out[fmt] = buf.getvalue()
    return out


def render_plot(summary: dict[str, Any], fmt: str = "png", *, dpi: int = 100) -> bytes:
    """The study's plot (its ``plot`` kind) as PNG or SVG bytes (:func:`render_plots`)."""
    return render_plots(summary, (fmt,), dpi=dpi)[fmt]
