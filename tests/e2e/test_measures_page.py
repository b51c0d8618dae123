"""The comparison page's measure selector, in a real browser: every heatmap switches to the
chosen measure, and its cells hold the values the REST matrix gives for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_tools import MODELS, Server, wait_done
from tests.e2e.test_browser import page, shot  # noqa: F401  (the page fixture)

pytestmark = pytest.mark.slow


def test_the_measure_selector_redraws_every_heatmap(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    body = {
        "model_ids": [server.model_ids[m] for m in MODELS[:2]],
        "dataset_id": server.digits_id,
        "batch_size": 150,
        "measures": ["pwcca", "procrustes"],
    }
    r = server.api.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    done = wait_done(server.api, cid)
    assert done["status"] == "succeeded", done
    page.goto(f"{server.url}/comparisons/{cid}")
    focus = page.locator("#focus svg.heatmap")
    focus.wait_for()
    assert focus.get_attribute("data-measure") == "cka"
    picker = page.locator("#measure-by")
    assert picker.is_visible()
    assert [o.get_attribute("value") for o in picker.locator("option").all()] == [
        "cka",
        "pwcca",
        "procrustes",
    ]
    picker.select_option("procrustes")
    page.locator('#focus svg.heatmap[data-measure="procrustes"]').wait_for()
    cards = page.locator(".heatmap-card svg.heatmap")
    assert cards.count() == 3
    assert all(c.get_attribute("data-measure") == "procrustes" for c in cards.all())
    a, b = MODELS[0], MODELS[1]
    m = server.api.get(
        f"/v1/comparisons/{cid}/matrix", params={"a": a, "b": b, "measure": "procrustes"}
    ).json()
    i, j = 1, 0
    focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]').hover()
    tooltip = page.locator("#heatmap-tooltip")
    tooltip.wait_for(state="visible")
    assert f"Procrustes similarity {m['values'][i][j]:.4f}" in tooltip.inner_text()
    assert "measure=procrustes" in (page.locator("#focus-json").get_attribute("href") or "")
    assert "Procrustes similarity per layer" in page.locator("#profile-caption").inner_text()
    shot(page, results_dir, "20-measure-procrustes")


def test_a_flagged_cell_says_so_in_the_tooltip_and_is_cross_hatched(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    """Layers wider than the sample (the Mixer's token-mixing outputs hold 512 features an
    image; digits' 450 test images): CCA is degenerate there, and the page says so at those
    cells and only there, as the REST body's flags give them."""
    body = {
        "model_ids": [server.model_ids[m] for m in MODELS[:2]],
        "dataset_id": server.digits_id,
        "batch_size": 150,
        "measures": ["cca"],
    }
    r = server.api.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    done = wait_done(server.api, cid)
    assert done["status"] == "succeeded", done
    a, b = MODELS[0], MODELS[1]
    m = server.api.get(
        f"/v1/comparisons/{cid}/matrix", params={"a": a, "b": b, "measure": "cca"}
    ).json()
    flagged = m["flags"]["cca_degenerate"]
    cells = [(i, j) for i, row in enumerate(flagged) for j, f in enumerate(row)]
    marked = [c for c in cells if flagged[c[0]][c[1]]]
    plain = [c for c in cells if not flagged[c[0]][c[1]]]
    assert marked and plain, flagged  # the case has both kinds of cell
    page.goto(f"{server.url}/comparisons/{cid}")
    page.locator("#measure-by").select_option("cca")
    focus = page.locator('#focus svg.heatmap[data-measure="cca"]')
    focus.wait_for()
    assert focus.locator("rect.flag-mark").count() == len(marked)
    tooltip = page.locator("#heatmap-tooltip")
    for (i, j), says in ((marked[0], True), (plain[0], False)):
        focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]').hover()
        tooltip.wait_for(state="visible")
        text = tooltip.inner_text()
        assert f"CCA R² {m['values'][i][j]:.4f}" in text
        assert ("Flagged: CCA degenerate" in text) is says, (i, j, text)
        page.mouse.move(0, 0)
    shot(page, results_dir, "21-measure-cca-flagged")
