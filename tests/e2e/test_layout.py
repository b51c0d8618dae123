"""What the pages look like at 1280 px: the depth profile fills its card and keeps every label
inside its box, the hatch legend's swatch is cell-sized, the Jobs filters sit in one row, the
comparisons list shows and filters the options that differ, and the model form's refusal names
the file sent."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.e2e_tools import MODELS, Server, sign_in, wait_done
from tests.e2e.test_browser import page, shot  # noqa: F401  (the page fixture)

pytestmark = pytest.mark.slow

# Every <text> of the profile: its box, the svg's box, the layer labels' and ticks' boxes.
BOXES = """(svg) => {
  const box = (e) => { const r = e.getBoundingClientRect();
                       return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  return {
    svg: box(svg),
    host: svg.parentElement.parentElement.clientWidth,
    texts: [...svg.querySelectorAll("text")].map((t) => ({text: t.textContent, ...box(t)})),
    layers: [...svg.querySelectorAll("text.layer-label")].map(box),
    ticks: [...svg.querySelectorAll("text.tick-label:not(.layer-label)")].map(box),
  };
}"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and (b["top"] < a["bottom"])
    )


@pytest.fixture(scope="module")
def blocks_only(server: Server) -> int:
    """A finished comparison of the blocks alone: its first layer label is ``blocks.0``."""
    body = {
        "model_ids": [server.model_ids[m] for m in MODELS[:2]],
        "dataset_id": server.digits_id,
        "layers": "blocks.*",
        "feature": "mean_tokens",
        "batch_size": 150,
    }
    r = server.api.post("/v1/comparisons", json=body)
    assert r.status_code in (200, 202), r.text
    assert wait_done(server.api, r.json()["id"])["status"] == "succeeded"
    return int(r.json()["id"])


def test_the_depth_profile_fills_its_card_with_every_label_inside(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
    blocks_only: int,
) -> None:
    for name, comparison_id in (("blocks", blocks_only), ("calibrated", server.calibrated_id)):
        page.goto(f"{server.url}/comparisons/{comparison_id}")
        svg = page.locator("#profile svg.profile")
        svg.wait_for()
        at = svg.evaluate(BOXES)
        assert at["svg"]["right"] - at["svg"]["left"] >= 0.9 * at["host"], (name, at["svg"])
        for t in at["texts"]:
            inside = (
                t["left"] >= at["svg"]["left"] - 0.5
                and t["right"] <= at["svg"]["right"] + 0.5
                and t["top"] >= at["svg"]["top"] - 0.5
                and t["bottom"] <= at["svg"]["bottom"] + 0.5
            )
            assert inside, (name, t, at["svg"])
        assert at["layers"] and not any(
            _overlap(a, b) for a in at["layers"] for b in at["ticks"]
        ), name
        first = page.locator("#profile text.layer-label").first.text_content()
        assert first == ("blocks.0" if name == "blocks" else "stem")
        shot(page, results_dir, f"30-profile-{name}")

    # The hatch legend's swatch is the size of a cell, not a speck.
    page.goto(f"{server.url}/comparisons/{server.calibrated_id}")
    swatch = page.locator("#null-legend svg").bounding_box()
    assert swatch is not None and swatch["width"] >= 32 and swatch["height"] >= 24, swatch


def test_the_jobs_filters_sit_in_one_row(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    page.goto(f"{server.url}/jobs")
    form = page.locator("#job-filters")
    boxes = [
        form.locator(s).bounding_box()
        for s in ('select[name="kind"]', 'select[name="status"]', "button")
    ]
    assert all(b is not None for b in boxes)
    middles = [b["y"] + b["height"] / 2 for b in boxes]  # type: ignore[index]
    assert max(middles) - min(middles) <= 4, boxes
    assert all(b["width"] < 260 for b in boxes), boxes  # type: ignore[index]
    shot(page, results_dir, "31-jobs-filters")


def test_the_list_shows_the_options_that_differ_and_filters_by_one(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
    blocks_only: int,
) -> None:
    page.goto(f"{server.url}/")
    row = page.locator(f'tr[data-comparison-id="{blocks_only}"]')
    chips = row.locator(".option-chip").all_inner_texts()
    assert chips == ["layers=blocks.*", "feature=mean_tokens"], chips
    calibrated = page.locator(f'tr[data-comparison-id="{server.calibrated_id}"] .option-chip')
    assert "baselines=random_init,seed_ceiling" in calibrated.all_inner_texts()
    shot(page, results_dir, "32-comparisons-options")
    row.locator(".option-chip", has_text="feature=mean_tokens").click()
    page.wait_for_url("**/?option=feature*")
    assert page.locator('input[name="option"]').input_value() == "feature=mean_tokens"
    ids = page.locator("tr[data-comparison-id]").evaluate_all(
        "(rows) => rows.map((r) => Number(r.dataset.comparisonId))"
    )
    assert ids == [blocks_only]


def test_the_model_form_names_the_file_sent_and_its_fault(
    page: Any,  # noqa: F811
    server: Server,
    tmp_path: Path,
) -> None:
    sign_in(page, server, "/models")
    page.get_by_text("Upload a model").click()
    evil = tmp_path / "model.pth"
    evil.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    page.locator('#model-upload input[name="weights"]').set_input_files(str(evil))
    page.get_by_role("button", name="Upload model").click()
    error = page.locator("#model-upload .form-error")
    error.filter(has_text="'model.pth' is a pickle-based PyTorch file").wait_for()
    assert "sidecar" not in error.inner_text()
