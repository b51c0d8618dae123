"""Heatmaps of an atlas: a K×K grid, one panel per model pair, with layer labels and a colour bar.

Uses matplotlib's object API only (``Figure`` + ``FigureCanvasAgg``), never pyplot: no global
state, safe in threads and servers. Undefined cells are drawn grey; a measure's flagged cells
(its value fixed by the sample's size, docs/measures.md) hatched. Output is deterministic:
no timestamps in the file metadata. Names (models, layers) are drawn as typed: before a
figure is saved :func:`plain_text` turns math text (``$...$``) and TeX off on every text
artist, so a name like ``$\\undefinedmacro{$`` is a label, not an error. matplotlib is imported
by the functions that draw, so the constants and :func:`learned_limit` (which a page needs)
cost no import of it.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from analysis.atlas import Atlas
from analysis.measures import TITLES
from analysis.measures.registry import flags_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "COLOURS",
    "FLAG_HATCH",
    "HEATMAP_COLORMAP",
    "LEARNED_COLORMAP",
    "MEASURE_TITLES",
    "UNDEFINED_COLOR",
    "learned_limit",
    "plain_text",
    "render_atlas",
]

# The colours of a CKA heatmap, shared with the web page (app/http/web/static/heatmap.js
# draws the same maps, and a test checks that its stops are these): viridis over [0, 1] for CKA,
# a diverging map centred at 0 for ``learned`` (CKA minus the untrained twins' mean), grey where
# a cell is undefined.
HEATMAP_COLORMAP = "viridis"
LEARNED_COLORMAP = "RdBu_r"
UNDEFINED_COLOR = "#bbbbbb"
# How a heatmap names each measure (each measure's declaration: analysis.measures.registry).
MEASURE_TITLES = TITLES
# How a cell is marked where a flag of its measure is raised (docs/measures.md, "Flags"): hatched
# over its colour, the page's heatmap.js the same; each mark is an element with the id
# "flagged-<row panel>-<column panel>-<i>-<j>" in an SVG.
FLAG_HATCH = "xxx"
# What a heatmap's colour can show: the value, or how far it lies above untrained twins.
COLOURS = ("cka", "learned")
# The learned scale runs over ±limit, the largest |learned| rounded up to this step.
LEARNED_STEP = 0.05

_METADATA = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
}


def plain_text(fig: Figure) -> None:
    """Every text artist of ``fig`` drawn as plain text: no math text, no TeX.

    Per artist rather than through rcParams, which are global: another thread's rc_context
    could switch them back while this figure is drawn.
    """
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_parse_math(False)
        text.set_usetex(False)


def _ticks(labels: list[str], most: int = 24) -> tuple[list[int], list[str]]:
    step = max(1, -(-len(labels) // most))
    idx = list(range(0, len(labels), step))
    return idx, [labels[i] for i in idx]


def learned_limit(values: np.ndarray) -> float:
    """The half-range of the learned colour scale: the largest |value| (NaN ignored) rounded
    up to :data:`LEARNED_STEP`, at least one step. The page computes the same."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    steps = float(np.ceil(round(top / LEARNED_STEP, 9)))
    return max(LEARNED_STEP, round(steps * LEARNED_STEP, 6))


def _mark(ax: Axes, flags: dict[str, np.ndarray], panel: str) -> None:
    """Hatch the cells where any of ``flags`` is raised (:data:`FLAG_HATCH`)."""
    from matplotlib.patches import Rectangle

    if not flags:
        return
    for i, j in zip(*np.logical_or.reduce(list(flags.values())).nonzero(), strict=True):
        ax.add_patch(
            Rectangle(
                (j - 0.5, i - 0.5),
                1,
                1,
                fill=False,
                hatch=FLAG_HATCH,
                edgecolor="white",
                linewidth=0,
                gid=f"flagged-{panel}-{i}-{j}",
            )
        )


def render_atlas(
    atlas: Atlas, fmt: str = "png", *, dpi: int = 100, colour: str = "cka", measure: str = "cka"
) -> bytes:
    """The atlas as PNG or SVG bytes: rows are models ``a`` (first layer on top), columns
    models ``b`` (first layer on the left). ``colour="learned"`` colours each cell by CKA minus
    its untrained twins' mean (:meth:`Atlas.verdicts`) on a diverging scale centred at 0; it
    needs the random-init baseline (a :class:`ValueError` without it). ``measure``: another
    measure the atlas has (:attr:`Atlas.measure_names`), drawn over [0, 1] and named in the
    title and the colour bar; the cells where one of its flags is raised (:meth:`Atlas.flagged`)
    are hatched, and the title says what the hatching means."""
    from matplotlib import colormaps, rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if fmt not in ("png", "svg"):
        raise ValueError(f"heatmaps are 'png' or 'svg', not {fmt!r}")
    if colour not in COLOURS:
        raise ValueError(f"a heatmap's colour is 'cka' or 'learned', not {colour!r}")
    k = len(atlas.models)
    size = max(3.2, 0.18 * max(len(v) for v in atlas.layers.values()) + 1.6)
    fig = Figure(figsize=(size * k + 1.0, size * k), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    if measure not in atlas.measure_names:
        raise ValueError(f"no measure {measure!r} in this atlas; it has {atlas.measure_names}")
    if measure != "cka" and colour != "cka":
        raise ValueError(f"colour {colour!r} is CKA's alone, not {measure}'s")
    blocks = {(a, b): atlas.matrix(a, b, measure) for a in atlas.models for b in atlas.models}
    title = MEASURE_TITLES.get(measure, measure)
    flagged = {(a, b): atlas.flagged(measure, a, b) for a, b in blocks}
    raised = [
        f
        for f in flags_of(measure)
        if any(f.name in v and v[f.name].any() for v in flagged.values())
    ]
    low, high, name, label = 0.0, 1.0, HEATMAP_COLORMAP, title
    if colour == "learned":
        for a, b in blocks:
            judged = atlas.verdicts(a, b)
            if judged is None or "learned" not in judged:
                raise ValueError(
                    "colour 'learned' needs the random-init baseline and intervals "
                    "(baselines=('random_init',))"
                )
            blocks[a, b] = judged["learned"]
        high = learned_limit(np.concatenate([m.ravel() for m in blocks.values()]))
        low, name, label = -high, LEARNED_COLORMAP, "CKA − untrained twins' mean"
    cmap = colormaps[name].with_extremes(bad=UNDEFINED_COLOR)
    axes = fig.subplots(k, k, squeeze=False)
    image = None
    for i, a in enumerate(atlas.models):
        for j, b in enumerate(atlas.models):
            ax = axes[i][j]
            m = np.ma.masked_invalid(blocks[a, b])
            # Row 0 (the input side) on top, as on the page.
            image = ax.imshow(m, vmin=low, vmax=high, cmap=cmap, origin="upper", aspect="auto")
            _mark(ax, flagged[a, b], f"{i}-{j}")
            ys, ylabels = _ticks(atlas.layers[a])
            xs, xlabels = _ticks(atlas.layers[b])
            ax.set_yticks(ys, ylabels, fontsize=6)
            ax.set_xticks(xs, xlabels, fontsize=6, rotation=90)
            ax.set_ylabel(a, fontsize=8)
            ax.set_xlabel(b, fontsize=8)
    assert image is not None
    fig.colorbar(image, ax=axes, shrink=0.8, label=label)
    cfg = atlas.config
    what = "CKA above untrained twins" if colour == "learned" else title
    how = f"{cfg.get('kernel', '?')}, {cfg.get('estimator', '?')}, {cfg.get('mode', '?')}"
    if measure != "cka":
        how = "centred features, whole sample"
    heading = f"{what} ({how}), n = {atlas.n}"
    if raised:
        heading += "\nhatched: " + "; ".join(f.label for f in raised)
    fig.suptitle(heading, fontsize=10)
    plain_text(fig)
    buf = io.BytesIO()
    with rc_context({"svg.hashsalt": "cka-atlas"}):  # stable SVG element ids
        fig.savefig(buf, format=fmt, metadata=_METADATA[fmt])
    return buf.getvalue()
