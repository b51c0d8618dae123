"""Heatmaps of an atlas: a K×K grid, one panel per model pair, with layer labels and a colour bar.

Uses matplotlib's object API only (``Figure`` + ``FigureCanvasAgg``), never pyplot: no global
state, safe in threads and servers. Undefined cells are drawn grey. Output is deterministic:
no timestamps in the file metadata. Names (models, layers) are drawn as typed: before a
figure is saved :func:`plain_text` turns math text (``$...$``) and TeX off on every text
artist, so a name like ``$\\undefinedmacro{$`` is a label, not an error.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from analysis.atlas import Atlas

__all__ = ["HEATMAP_COLORMAP", "UNDEFINED_COLOR", "plain_text", "render_atlas"]

# The colours of a CKA heatmap, shared with the web page (app/http/web/static/heatmap.js
# draws the same map, and a test checks that its stops are this one's): viridis over [0, 1],
# grey where a cell is undefined.
HEATMAP_COLORMAP = "viridis"
UNDEFINED_COLOR = "#bbbbbb"

_METADATA = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
}


def plain_text(fig: Figure) -> None:
    """Every text artist of ``fig`` drawn as plain text: no math text, no TeX.

    Per artist rather than through rcParams, which are global: another thread's rc_context
    could switch them back while this figure is drawn.
    """
    for text in fig.findobj(Text):
        text.set_parse_math(False)
        text.set_usetex(False)


def _ticks(labels: list[str], most: int = 24) -> tuple[list[int], list[str]]:
    step = max(1, -(-len(labels) // most))
    idx = list(range(0, len(labels), step))
    return idx, [labels[i] for i in idx]


def render_atlas(atlas: Atlas, fmt: str = "png", *, dpi: int = 100) -> bytes:
    """The atlas as PNG or SVG bytes: rows are models ``a`` (first layer on top), columns
    models ``b`` (first layer on the left)."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"heatmaps are 'png' or 'svg', not {fmt!r}")
    k = len(atlas.models)
    size = max(3.2, 0.18 * max(len(v) for v in atlas.layers.values()) + 1.6)
    fig = Figure(figsize=(size * k + 1.0, size * k), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    cmap = colormaps[HEATMAP_COLORMAP].with_extremes(bad=UNDEFINED_COLOR)
    axes = fig.subplots(k, k, squeeze=False)
    image = None
    for i, a in enumerate(atlas.models):
        for j, b in enumerate(atlas.models):
            ax = axes[i][j]
            m = np.ma.masked_invalid(atlas.matrix(a, b))
            # Row 0 (the input side) on top, as on the page.
            image = ax.imshow(m, vmin=0.0, vmax=1.0, cmap=cmap, origin="upper", aspect="auto")
            ys, ylabels = _ticks(atlas.layers[a])
            xs, xlabels = _ticks(atlas.layers[b])
            ax.set_yticks(ys, ylabels, fontsize=6)
            ax.set_xticks(xs, xlabels, fontsize=6, rotation=90)
            ax.set_ylabel(a, fontsize=8)
            ax.set_xlabel(b, fontsize=8)
    assert image is not None
    fig.colorbar(image, ax=axes, shrink=0.8, label="CKA")
    cfg = atlas.config
    fig.suptitle(
        f"CKA ({cfg.get('kernel', '?')}, {cfg.get('estimator', '?')}, {cfg.get('mode', '?')}), "
        f"n = {atlas.n}",
        fontsize=10,
    )
    plain_text(fig)
    buf = io.BytesIO()
    with rc_context({"svg.hashsalt": "cka-atlas"}):  # stable SVG element ids
        fig.savefig(buf, format=fmt, metadata=_METADATA[fmt])
    return buf.getvalue()
