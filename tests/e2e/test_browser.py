"""The web page in a real browser: list, atlas heatmaps, hover values, sign-in, a live job.

Screenshots of every step land in ``test-results/e2e/`` (see the ``results_dir`` fixture).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from app.store.cells import probability_text
from tests.e2e.e2e_tools import MODELS, TOKEN, Server, sign_in

pytestmark = pytest.mark.slow


@pytest.fixture
def page(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def shot(page: Any, results: Path, name: str) -> None:
    page.screenshot(path=str(results / f"{name}.png"), full_page=True)


def focused_pair(page: Any, server: Server, comparison_id: int) -> tuple[Any, dict[str, Any]]:
    """The focused heatmap of the open comparison page, once drawn, and the REST matrix of its
    pair: model 0 (rows) × model 1 (columns), which the heatmap names."""
    focus = page.locator("#focus svg.heatmap")
    focus.wait_for()
    a, b = MODELS[0], MODELS[1]
    matrix = server.api.get(
        f"/v1/comparisons/{comparison_id}/matrix", params={"a": a, "b": b}
    ).json()
    assert focus.get_attribute("data-a") == a and focus.get_attribute("data-b") == b
    return focus, matrix


def test_list_and_finished_atlas(page: Any, server: Server, results_dir: Path) -> None:
    page.goto(server.url + "/")
    row = page.locator(f'tr[data-comparison-id="{server.finished_id}"]')
    assert row.locator(".pill").text_content() == "succeeded"
    for name in MODELS:
        assert row.get_by_role("link", name=name).count() == 1
    shot(page, results_dir, "01-comparisons")

    # Filtering by status keeps the row; filtering by another status drops it.
    page.select_option('select[name="status"]', "failed")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(lambda url: "status=failed" in url)
    assert row.count() == 0

    page.goto(server.url + "/")
    row.get_by_role("link", name=str(server.finished_id)).click()
    page.wait_for_url(f"**/comparisons/{server.finished_id}")
    # The focused heatmap: model 0 (rows) × model 1 (columns), one cell per layer pair.
    focus, matrix = focused_pair(page, server, server.finished_id)
    rows, cols = matrix["rows"], matrix["cols"]
    assert int(focus.get_attribute("data-rows")) == len(rows)
    assert int(focus.get_attribute("data-cols")) == len(cols)
    assert focus.locator("rect.cell").count() == len(rows) * len(cols)
    assert focus.locator("text.row-label").all_text_contents() == rows
    assert focus.locator("text.col-label").all_text_contents() == cols

    # Hovering a cell shows its exact value, the same as the REST matrix.
    i, j = len(rows) - 2, 1
    cell = focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]')
    cell.hover()
    tooltip = page.locator("#heatmap-tooltip")
    tooltip.wait_for(state="visible")
    expected = matrix["values"][i][j]
    assert float(cell.get_attribute("data-value")) == expected
    text = tooltip.inner_text()
    assert f"CKA {expected:.4f}" in text and rows[i] in text and cols[j] in text
    shot(page, results_dir, "02-atlas-hover")

    # Every model pair has a card: 3 between models and 3 within.
    assert page.locator("#grid-between .heatmap-card").count() == 3
    assert page.locator("#grid-within .heatmap-card").count() == 3
    for link, suffix in (("#dl-json", "/result"), ("#dl-png", ".png"), ("#dl-svg", ".svg")):
        href = page.locator(link).get_attribute("href")
        assert href == f"/v1/comparisons/{server.finished_id}" + (
            suffix if suffix == "/result" else f"/heatmap{suffix}"
        )
    page.locator(".heatmap-card", has_text=f"{MODELS[1]} × {MODELS[2]}").click()
    assert focus.get_attribute("data-a") == MODELS[1]
    assert focus.get_attribute("data-b") == MODELS[2]

    # On a phone the page reflows to one column and nothing overflows sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    page.locator("#focus svg.heatmap").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(page, results_dir, "09-phone")


def test_sign_in_and_watch_a_new_comparison(page: Any, server: Server, results_dir: Path) -> None:
    page.goto(server.url + "/comparisons/new")
    assert page.locator("#login-notice").is_visible()
    assert page.locator("#submit").is_disabled()
    page.locator("#login-notice").get_by_role("link", name="Sign in").click()
    page.wait_for_url(lambda url: "/login?next=" in url)
    page.fill('input[name="token"]', "wrong")
    page.get_by_role("button", name="Sign in").click()
    assert "not accepted" in page.locator(".form-error").inner_text()
    page.fill('input[name="token"]', TOKEN)
    shot(page, results_dir, "03-sign-in")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/comparisons/new")
    assert page.locator(".signed-in").is_visible()
    assert "token" not in page.url

    for name in MODELS[:2]:
        page.locator(".model-option", has_text=name).locator("input").check()
    page.select_option('select[name="dataset_id"]', str(server.big_dataset_id))
    page.fill('input[name="kernel"]', "rbf")
    page.fill('input[name="batch_size"]', "16")
    shot(page, results_dir, "04-new-comparison")
    page.get_by_role("button", name="Start comparison").click()
    page.wait_for_url(re.compile(r"/comparisons/\d+$"))
    new_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert new_id != server.finished_id

    bar = page.locator("#progress")
    seen: list[float] = []
    deadline = time.monotonic() + 90
    shot_taken = False
    while time.monotonic() < deadline:
        value = float(bar.get_attribute("aria-valuenow"))
        if not seen or value != seen[-1]:
            seen.append(value)
        if 0 < value < 1 and not shot_taken:
            shot(page, results_dir, "05-progress")
            shot_taken = True
        if value >= 1:
            break
        page.wait_for_timeout(100)
    assert seen and seen[-1] == 1.0, f"the progress bar stopped at {seen}"
    assert seen == sorted(seen), f"the progress bar went backwards: {seen}"
    page.locator("#status-pill .pill", has_text="succeeded").wait_for()
    focus = page.locator("#focus svg.heatmap")
    focus.wait_for()
    api_view = server.api.get(f"/v1/comparisons/{new_id}").json()
    assert api_view["status"] == "succeeded" and api_view["params"]["kernel"] == "rbf"
    layers = api_view["params"]["resolved_layers"]
    assert focus.locator("rect.cell").count() == len(layers[MODELS[0]]) * len(layers[MODELS[1]])
    page.locator("#downloads").wait_for(state="visible")
    page.locator(".details dd", has_text="images").first.wait_for()
    shot(page, results_dir, "06-new-comparison-finished")
    print(f"progress values seen: {seen}")


def test_calibrated_cell_tooltip_summary_and_profile(
    page: Any, server: Server, results_dir: Path
) -> None:
    page.goto(f"{server.url}/comparisons/{server.calibrated_id}")
    focus, m = focused_pair(page, server, server.calibrated_id)

    # The tooltip: value, bootstrap interval, p-value with the null mean, random-init baseline.
    i, j = 1, 2
    focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]').hover()
    tooltip = page.locator("#heatmap-tooltip")
    tooltip.wait_for(state="visible")
    text = tooltip.inner_text()
    assert f"CKA {m['values'][i][j]:.4f}" in text
    assert f"95 % interval [{m['ci_low'][i][j]:.4f}, {m['ci_high'][i][j]:.4f}]" in text
    assert f"null mean {m['null_mean'][i][j]:.4f}" in text
    rests_on = {
        "analytic": "analytic null",
        "permutation": "permutations",
        "monte_carlo": "drawn permutations",
        "bound": "moment bound",
    }[m["p_method"][i][j]]
    assert f"({rests_on}) · q = " in text  # what the p-value rests on, named after it
    spread = m["baselines"]["random_init_sd"][i][j]
    assert f"random init {m['baselines']['random_init'][i][j]:.4f} ± {spread:.4f}" in text
    assert f"seed ceiling undefined: {m['undefined_baselines']['seed_ceiling']}" in text
    shot(page, results_dir, "10-calibrated-hover")

    # Cells the null cannot tell apart (q >= 0.05) are hatched, and the legend says so.
    null_like = sum(q is not None and q >= 0.05 for row in m["q_value"] for q in row)
    assert focus.locator("rect.cell.null-like").count() == null_like
    assert focus.locator("rect.hatch").count() == null_like
    assert page.locator("#null-legend").is_visible()
    # The marking itself, on a matrix with known p-values: hatched from p = 0.05 up.
    marked = page.evaluate(
        """() => {
          const host = document.createElement("div");
          document.body.appendChild(host);
          const svg = window.CkaHeatmap.draw(host, {
            a: "x", b: "y", rows: ["r0", "r1"], cols: ["c0", "c1"],
            values: [[0.9, 0.2], [0.3, 0.8]], q_value: [[0.01, 0.2], [0.05, null]],
          });
          const out = [...svg.querySelectorAll("rect.cell.null-like")].map(
            (r) => r.dataset.i + "," + r.dataset.j);
          host.remove();
          return out;
        }"""
    )
    assert marked == ["0,1", "1,0"]
    # p- and q-values follow the command line's one rule (issue 47: the tooltip said
    # "p = 0.0e+0" where the CLI says "<1e-300").
    probabilities = [0.0, 1e-301, 3.2e-5, 4.6e-4, 0.001, 0.0123, 0.5, 1.0]
    shown = page.evaluate("(ps) => ps.map(window.CkaHeatmap.formatP)", probabilities)
    assert shown == [probability_text(p) for p in probabilities]
    assert shown[:3] == ["<1e-300", "<1e-300", "3e-05"]

    # The K×K summary opens the atlas: the mean diagonal CKA of (a, b) with its interval.
    summary = page.locator("#summary .summary-cell")
    assert summary.count() == 4
    a, b = MODELS[0], MODELS[1]
    cell = page.locator(f'#summary .summary-cell[data-a="{a}"][data-b="{b}"]')
    diagonal = [m["values"][k][k] for k in range(len(m["rows"]))]
    low = [m["ci_low"][k][k] for k in range(len(m["rows"]))]
    assert f"{sum(diagonal) / len(diagonal):.3f}" in cell.inner_text()
    assert f"[{sum(low) / len(low):.3f}," in (cell.get_attribute("title") or "")

    # The depth profile of the pair: the diagonal, its best matches and the baseline.
    profile = page.locator("#profile svg.profile")
    series = {
        p.get_attribute("data-series"): json.loads(p.get_attribute("data-values"))
        for p in profile.locator("path.series").all()
    }
    assert series["diagonal"] == diagonal
    assert series["best match"] == [max(v for v in row if v is not None) for row in m["values"]]
    init = m["baselines"]["random_init"]
    assert series["random init"] == [init[k][k] for k in range(len(m["rows"]))]
    assert profile.locator("polygon.band").count() == 2
    shot(page, results_dir, "11-calibrated-profile")


def test_model_and_dataset_pages(page: Any, server: Server, results_dir: Path) -> None:
    model_id = server.model_ids[MODELS[0]]
    page.goto(f"{server.url}/models/{model_id}")
    assert page.locator("h1").inner_text() == MODELS[0]
    assert page.locator(f'tr[data-comparison-id="{server.finished_id}"]').count() == 1
    stat = page.locator(".stat", has_text="Ω").locator(".stat-value").inner_text()
    expected = server.api.get(f"/v1/models/{model_id}").json()["connections"]
    assert stat.replace(",", "") == str(expected)
    shot(page, results_dir, "07-model")

    page.goto(f"{server.url}/datasets/{server.digits_id}")
    images = page.locator("#samples img")
    assert images.count() == 12
    images.last.scroll_into_view_if_needed()
    page.wait_for_function(
        "() => [...document.querySelectorAll('#samples img')].every(i => i.naturalWidth > 0)"
    )
    sha = server.api.get(f"/v1/datasets/{server.digits_id}").json()["sha256"]
    assert page.locator("#dataset-sha").inner_text() == sha
    shot(page, results_dir, "08-dataset")


# The worker cell of every training row whose state pill reads "running" (one round trip).
RUNNING_WORKERS = """() => Array.from(document.querySelectorAll('#members tbody tr'))
  .filter((r) => r.querySelector('.training-state').textContent.trim() === 'running')
  .map((r) => r.querySelector('.training-worker').textContent.trim())"""


def test_start_and_watch_a_study(page: Any, server: Server, results_dir: Path) -> None:
    """The built-in sparsity study (one seed, quick recipe) started from the form, watched live,
    then read: the plot, the table of arms and the links to every model and to the atlas."""
    sign_in(page, server, "/studies")
    page.select_option('select[name="builtin"]', "sparsity")
    page.fill('input[name="seeds"]', "1")
    page.check('input[name="quick"]')
    shot(page, results_dir, "10-new-study")
    page.get_by_role("button", name="Start study").click()
    page.wait_for_url(re.compile(r"/studies/\d+$"))
    study_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    counts: list[int] = []
    live_rows: set[str] = set()  # a training's row as the poll showed it while it ran
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if page.locator("#arms").count():
            break
        live_rows.update(page.evaluate(RUNNING_WORKERS))
        text = page.locator("#progress-text").inner_text()
        found = re.match(r"trainings (\d+) of 8", text)
        if found and (not counts or int(found.group(1)) != counts[-1]):
            counts.append(int(found.group(1)))
            if len(counts) == 2:
                shot(page, results_dir, "11-study-progress")
        page.wait_for_timeout(200)
    assert page.locator("#arms").count() == 1, "the study page did not show its results"
    assert counts == sorted(counts) and len(counts) >= 2, f"trainings seen: {counts}"
    # each training is a job: its row showed it running, and on which worker
    assert live_rows and all(w.startswith("embedded") for w in live_rows), live_rows

    view = server.api.get(f"/v1/studies/{study_id}").json()
    assert view["status"] == "succeeded" and view["trainings"]["total"] == 8
    assert page.locator("#status-pill .pill").text_content() == "succeeded"
    assert page.locator("#arms tbody tr").count() == 8  # the reference and seven arms
    page.wait_for_function("() => document.getElementById('study-plot').naturalWidth > 0")
    for member in view["models"]:
        assert page.locator(f'#members a[href="/models/{member["model_id"]}"]').count() == 1
        row = page.locator(f'#members tr[data-key="{member["training_key"]}"]')
        assert (row.locator(".training-state").text_content() or "").strip() == "succeeded"
        assert (row.locator(".training-worker").text_content() or "").startswith("embedded")
    shot(page, results_dir, "12-study-finished")
    page.locator("#atlas-link").click()
    page.wait_for_url(f"**/comparisons/{view['comparison_id']}")
    page.locator("#focus svg.heatmap").wait_for()

    page.goto(f"{server.url}/models/{view['models'][1]['model_id']}")
    model = server.api.get(f"/v1/models/{view['models'][1]['model_id']}").json()
    assert page.locator("#structure-omega").inner_text().replace(",", "") == str(model["omega"])


def test_training_form_refuses_an_option(page: Any, server: Server, results_dir: Path) -> None:
    sign_in(page, server, "/trainings/new")
    page.select_option('select[name="arch"]', "sw_mlp_digits")
    page.fill('fieldset[data-arch="sw_mlp_digits"] input[name="config.density"]', "2")
    page.get_by_role("button", name="Start training").click()
    error = page.locator(
        'fieldset[data-arch="sw_mlp_digits"] .field-error[data-for="config.density"]'
    )
    error.wait_for(state="visible")
    assert "density" in error.inner_text() and "1" in error.inner_text()
    before = server.api.get("/v1/trainings").json()["total"]
    page.fill('fieldset[data-arch="sw_mlp_digits"] input[name="config.density"]', "0.125")
    page.fill('fieldset[data-arch="sw_mlp_digits"] input[name="config.num_blocks"]', "2")
    page.fill('input[name="epochs"]', "1")
    page.get_by_role("button", name="Start training").click()
    page.locator("#trained-model").wait_for(timeout=300_000)
    shot(page, results_dir, "13-training")
    assert server.api.get("/v1/trainings").json()["total"] == before + 1
    model_id = int(page.locator("#trained-model").get_attribute("href").rsplit("/", 1)[1])
    model = server.api.get(f"/v1/models/{model_id}").json()
    assert model["density"] == 0.125 and model["config"]["num_blocks"] == 2


def test_the_tooltip_leads_with_the_verdict_and_colour_shows_what_training_added(
    page: Any, server: Server, results_dir: Path
) -> None:
    page.goto(f"{server.url}/comparisons/{server.calibrated_id}")
    focus, m = focused_pair(page, server, server.calibrated_id)
    words = {
        "above_untrained": "Above untrained twins",
        "not_above_untrained": "Not above untrained twins",
        "undecided": "Undecided against untrained twins",
    }
    learned = m["verdicts"]["learned"]
    i, j = 1, 2
    focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]').hover()
    tooltip = page.locator("#heatmap-tooltip")
    tooltip.wait_for(state="visible")
    lines = tooltip.inner_text().splitlines()
    verdict = m["verdicts"]["learned_verdict"][i][j]
    assert lines[0].startswith(words[verdict]), lines  # the verdict first, in words
    sign = "+" if learned[i][j] >= 0 else "\u2212"
    assert f"{sign}{abs(learned[i][j]):.3f}" in lines[0]
    assert lines[1] == f"CKA {m['values'][i][j]:.4f}"
    shot(page, results_dir, "12-verdict-hover")

    # Colour by what training added: every heatmap redrawn on the diverging scale.
    cell = focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]')
    before = cell.get_attribute("fill")
    assert page.locator("#colour-by-label").is_visible()
    page.select_option("#colour-by", "learned")
    focus = page.locator('#focus svg.heatmap[data-colour="learned"]')
    focus.wait_for()
    cell = focus.locator(f'rect.cell[data-i="{i}"][data-j="{j}"]')
    after = cell.get_attribute("fill")
    assert after != before
    limit = page.evaluate("() => JSON.parse(document.getElementById('atlas-data').textContent)")
    want = page.evaluate(
        "([v, lim]) => window.CkaHeatmap.divergingColor(v, lim)",
        [learned[i][j], limit["learned_limit"]],
    )
    assert after == want
    assert page.locator('#colorbar svg[data-colour="learned"]').count() == 1
    cards = page.locator("#grid-between svg.heatmap")
    assert cards.count() and all(
        cards.nth(k).get_attribute("data-colour") == "learned" for k in range(cards.count())
    )
    # a cell at 0 is the scale's white middle; the learned scale's ends are the PNG's map's
    middle = page.evaluate("() => window.CkaHeatmap.divergingColor(0, 0.2)")
    assert middle == "rgb(247,246,246)"
    shot(page, results_dir, "13-colour-by-learned")
    page.select_option("#colour-by", "cka")
    page.locator('#focus svg.heatmap[data-colour="cka"]').wait_for()
