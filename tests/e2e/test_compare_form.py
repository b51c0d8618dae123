"""The new-comparison form, in a real browser: it offers every option of
:class:`analysis.CompareOptions`, each at its default with its description and its bounds,
choices or pattern; and a comparison asked for there with whole-sample measures sends a
typed body and ends with their matrices stored."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from analysis.options import OptionSpec, option_specs
from app.jobs.requests import ComparisonIn
from tests.e2e.e2e_tools import MODELS, Server, sign_in, wait_done
from tests.e2e.test_browser import page, shot  # noqa: F401  (the page fixture)

pytestmark = pytest.mark.slow


def shown(value: Any) -> str:
    """A default as the form writes it: on/off, none, a list joined by commas."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ", ".join(value) or "none"
    return str(value)


def words(text: str | None) -> str:
    return " ".join((text or "").replace("`", "").split())


def check_control(field: Any, spec: OptionSpec, bounds: OptionSpec) -> None:
    """The control of one option holds its default and allows what the API takes."""
    name = spec.name
    if spec.kind == "choices":
        boxes = field.locator(f'input[type="checkbox"][name="{name}"]')
        assert [b.get_attribute("value") for b in boxes.all()] == list(spec.choices), name
        ticked = [b.get_attribute("value") for b in boxes.all() if b.is_checked()]
        assert ticked == list(spec.default), name
        return
    control = field.locator(f'[name="{name}"]')
    assert control.count() == 1, name
    if spec.kind == "flag":
        assert control.get_attribute("type") == "checkbox"
        assert control.is_checked() is spec.default, name
    elif spec.kind == "choice":
        values = [o.get_attribute("value") for o in control.locator("option").all()]
        assert values == list(spec.choices), name
        assert control.input_value() == spec.default, name
    elif spec.kind == "int":
        assert control.get_attribute("type") == "number"
        assert control.input_value() == str(spec.default), name
        for attribute, bound in (("min", bounds.minimum), ("max", bounds.maximum)):
            assert control.get_attribute(attribute) == (None if bound is None else str(bound))
    elif spec.kind == "text":
        assert control.input_value() == spec.default, name
        assert control.get_attribute("pattern") == spec.pattern, name
    else:  # layers: blank is every model's default layers
        assert spec.kind == "layers" and spec.default is None
        assert control.input_value() == ""


def test_the_form_offers_every_option_at_its_default(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    specs = {name: s for name, s in option_specs().items() if not s.deprecated}
    taken = option_specs(ComparisonIn)  # the bounds the API takes (the service's caps too)
    page.goto(server.url + "/comparisons/new")
    fields = page.locator("#new-comparison [data-option]")
    assert [f.get_attribute("data-option") for f in fields.all()] == list(specs)
    for name, spec in specs.items():
        field = page.locator(f'#new-comparison [data-option="{name}"]')
        assert field.get_attribute("data-kind") == spec.kind, name
        check_control(field, spec, taken[name])
        meta = words(field.locator(".option-meta").text_content())
        assert meta.startswith(f"default {shown(spec.default)}"), (name, meta)
        bounds = taken[name]
        if bounds.minimum is not None and bounds.maximum is not None:
            assert f"{bounds.minimum:,} to {bounds.maximum:,}" in meta, (name, meta)
        elif bounds.minimum is not None:
            assert f"at least {bounds.minimum:,}" in meta, (name, meta)
        # The description is all there (a long one folded: its first words, the rest on a click).
        about = field.locator(".option-description")
        assert words(taken[name].description) in words(about.text_content()), name
    # The deprecated bootstrap stays off the form.
    assert page.locator('[name="bootstrap"]').count() == 0

    # A long description unfolds on a click and folds again.
    about = page.locator('[data-option="null"] .option-description details')
    assert not about.evaluate("d => d.open")
    about.locator("summary").click()
    assert about.evaluate("d => d.open")
    assert "Pearson type III" in about.inner_text()
    shot(page, results_dir, "21-new-comparison-options")


def test_measures_asked_for_on_the_form_are_stored(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    sign_in(page, server, "/comparisons/new")
    for name in MODELS[:2]:  # by id: other tests may upload a model of the same name
        page.check(f'input[name="model_ids"][value="{server.model_ids[name]}"]')
    page.select_option('select[name="dataset_id"]', str(server.digits_id))
    page.fill('input[name="batch_size"]', "150")
    for measure in ("cca", "procrustes", "mutual_knn"):
        page.check(f'input[name="measures"][value="{measure}"]')
    page.fill('input[name="knn_k"]', "5")
    page.check('input[name="sensitivity"]')
    # What the API refuses is said under the option's own control.
    page.fill('input[name="kernel"]', "cosine")
    page.get_by_role("button", name="Start comparison").click()
    refusal = page.locator('.field-error[data-for="kernel"]')
    refusal.filter(has_text="kernel").wait_for()
    assert "invalid" in (page.locator("#field-kernel").get_attribute("class") or "")
    page.fill('input[name="kernel"]', "linear")
    with page.expect_request(
        lambda r: r.method == "POST" and r.url.endswith("/v1/comparisons")
    ) as sent:
        page.get_by_role("button", name="Start comparison").click()
    body = sent.value.post_data_json
    # Typed as the API reads them: lists, numbers and booleans, never strings.
    assert body["measures"] == ["cka", "cca", "procrustes", "mutual_knn"]
    assert body["knn_k"] == 5 and body["batch_size"] == 150 and body["seed"] == 0
    assert body["sensitivity"] is True and body["force"] is False
    assert body["baselines"] == [] and body["layers"] is None and body["kernel"] == "linear"
    assert set(body) == {"model_ids", "dataset_id", "force"} | {
        name for name, s in option_specs().items() if not s.deprecated
    }

    page.wait_for_url(re.compile(r"/comparisons/\d+$"))
    cid = int(page.url.rstrip("/").rsplit("/", 1)[1])
    done = wait_done(server.api, cid)
    assert done["status"] == "succeeded", done
    assert done["params"]["measures"] == ["cka", "cca", "procrustes", "mutual_knn"]
    assert done["params"]["knn_k"] == 5 and done["params"]["sensitivity"] is True

    a, b = MODELS[0], MODELS[1]
    url = f"/v1/comparisons/{cid}/matrix"
    cka = server.api.get(url, params={"a": a, "b": b}).json()
    for measure in ("cca", "procrustes", "mutual_knn"):
        r = server.api.get(url, params={"a": a, "b": b, "measure": measure})
        assert r.status_code == 200, r.text
        m = r.json()
        assert (m["rows"], m["cols"]) == (cka["rows"], cka["cols"])
        values = [v for row in m["values"] for v in row]
        assert len(values) == len(cka["rows"]) * len(cka["cols"])
        assert all(v is not None and math.isfinite(v) and -1e-9 <= v <= 1 + 1e-9 for v in values)
        assert m["values"] != cka["values"], measure
    # A measure the form left unticked was not computed.
    r = server.api.get(url, params={"a": a, "b": b, "measure": "pwcca"})
    assert r.status_code == 422 and r.json()["code"] == "unknown_measure"
    page.locator("#measure-by").wait_for()
    shot(page, results_dir, "22-measures-from-the-form")
