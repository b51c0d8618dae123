"""The PNG heatmap and the page's heatmap agree: one colour map, one row order, one grey."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb
from PIL import Image

from analysis.atlas import Atlas
from analysis.plot import (
    HEATMAP_COLORMAP,
    LEARNED_COLORMAP,
    UNDEFINED_COLOR,
    learned_limit,
    render_atlas,
)

HEATMAP_JS = Path(__file__).resolve().parents[2] / "app" / "http" / "web" / "static" / "heatmap.js"


def test_the_page_draws_the_colour_map_and_grey_of_the_png() -> None:
    script = HEATMAP_JS.read_text()
    stops = re.search(r"const VIRIDIS = \[(.*?)\]", script, re.S)
    assert stops, "heatmap.js names its colour stops VIRIDIS"
    page = re.findall(r'"(#[0-9a-f]{6})"', stops.group(1))
    cmap = colormaps[HEATMAP_COLORMAP]
    assert page == [to_hex(cmap(t)) for t in np.linspace(0, 1, len(page))]
    grey = re.search(r'const UNDEFINED = "(#[0-9a-f]{6})"', script)
    assert grey and grey.group(1) == UNDEFINED_COLOR


def test_the_page_draws_the_learned_scale_of_the_png() -> None:
    script = HEATMAP_JS.read_text()
    stops = re.search(r"const DIVERGING = \[(.*?)\]", script, re.S)
    assert stops, "heatmap.js names its learned colour stops DIVERGING"
    page = re.findall(r'"(#[0-9a-f]{6})"', stops.group(1))
    cmap = colormaps[LEARNED_COLORMAP]
    assert page == [to_hex(cmap(t)) for t in np.linspace(0, 1, len(page))]
    # the scale's half-range: the largest |learned| rounded up to 0.05, at least 0.05
    assert learned_limit(np.array([0.01, -0.02, np.nan])) == 0.05
    assert learned_limit(np.array([0.12, -0.31])) == 0.35
    assert learned_limit(np.array([0.1, 0.3])) == 0.3


def test_png_rows_run_top_down_from_the_first_layer_as_on_the_page() -> None:
    # CKA of three layers with themselves: 1 on the diagonal, 0 between the first and last.
    hsic = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.5], [0.0, 0.5, 1.0]])
    atlas = Atlas(models=["m"], layers={"m": ["first", "mid", "last"]}, hsic=hsic, n=10)
    pixels = np.asarray(Image.open(io.BytesIO(render_atlas(atlas, "png"))).convert("RGB"))
    cmap = colormaps[HEATMAP_COLORMAP]
    high, low = (np.array(to_rgb(cmap(v))) * 255 for v in (1.0, 0.0))
    is_high = np.abs(pixels - high).max(axis=2) < 3
    is_low = np.abs(pixels - low).max(axis=2) < 3
    ys, xs = np.nonzero(is_high | is_low)
    left = xs.min()  # the panel's left edge (the colour bar stands to its right)
    column = xs < left + 4
    top = ys[column].min()
    # The top-left cell is (first, first) = 1 with row 0 on top; bottom-up, (last, first) = 0.
    assert is_high[top, left] and not is_low[top, left]
