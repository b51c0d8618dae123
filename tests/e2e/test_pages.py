"""The Jobs page, the upload forms and the offline API docs, in a real browser."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from tests.e2e.e2e_tools import MODELS, Server, sign_in
from tests.e2e.test_browser import page, shot  # noqa: F401  (the page fixture)

pytestmark = pytest.mark.slow


def test_jobs_page_lists_a_running_job_and_cancels_it(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    # A comparison long enough to be caught running: small batches, many permutations.
    body = {
        "model_ids": [server.model_ids[m] for m in MODELS],
        "dataset_id": server.big_dataset_id,
        "batch_size": 16,
        "kernel": "rbf",
        "permutations": 2000,
        "force": True,
    }
    r = server.api.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    comparison = f"/v1/comparisons/{r.json()['id']}"
    listed = server.api.get("/v1/jobs", params={"kind": "comparison"}).json()["items"]
    job_id = next(j["id"] for j in listed if j["links"].get("comparison") == comparison)
    deadline = time.monotonic() + 60
    while server.api.get(f"/v1/jobs/{job_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, "the comparison never started"
        time.sleep(0.1)

    sign_in(page, server, "/jobs")
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    assert row.locator(".pill").inner_text().lower() == "running"
    assert row.locator("td", has_text="comparison").first.is_visible()
    shot(page, results_dir, "20-jobs-running")
    page.on("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Cancel").click()
    page.locator("#jobs-message", has_text="cancel requested").wait_for()
    row.locator(".pill", has_text=re.compile("cancelled", re.I)).wait_for(timeout=60_000)
    shot(page, results_dir, "21-jobs-cancelled")
    assert server.api.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    # Filters narrow the list to what they name.
    page.goto(f"{server.url}/jobs?status=cancelled")
    assert page.locator(f'tr[data-job-id="{job_id}"]').count() == 1
    assert page.locator("tr[data-job-id] .pill", has_text="succeeded").count() == 0


def test_upload_forms_store_a_dataset_and_a_model(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(7)
    npz = tmp_path / "noise.npz"
    np.savez(npz, x=rng.random((12, 1, 8, 8)).astype(np.float32), y=np.arange(12) % 3)
    sign_in(page, server, "/datasets")
    page.get_by_text("Upload a dataset").click()
    form = page.locator("#dataset-upload")
    form.locator('input[name="file"]').set_input_files(str(npz))
    form.locator('input[name="name"]').fill("noise from the form")
    form.get_by_role("button", name="Upload dataset").click()
    page.wait_for_url(re.compile(r"/datasets/\d+$"))
    assert "noise from the form" in page.locator("h1").inner_text()
    dataset_id = int(page.url.rsplit("/", 1)[1])
    stored = server.api.get(f"/v1/datasets/{dataset_id}").json()
    assert stored["n"] == 12 and stored["classes"] == ["0", "1", "2"]
    shot(page, results_dir, "22-dataset-uploaded")

    # A model: an untrained twin of a stored one, saved as a weights file with its sidecar.
    import models

    model = models.create("gmlp_digits", seed=123)
    weights = models.save(model, tmp_path / "twin.safetensors", seed=123)
    page.goto(f"{server.url}/models")
    page.get_by_text("Upload a model").click()
    form = page.locator("#model-upload")
    form.locator('input[name="weights"]').set_input_files(str(weights))
    form.locator('input[name="sidecar"]').set_input_files(str(weights.with_suffix(".json")))
    form.locator('input[name="name"]').fill("gmlp twin from the form")
    form.get_by_role("button", name="Upload model").click()
    page.wait_for_url(re.compile(r"/models/\d+$"))
    assert "gmlp twin from the form" in page.locator("h1").inner_text()
    model_id = int(page.url.rsplit("/", 1)[1])
    assert server.api.get(f"/v1/models/{model_id}").json()["arch"] == "gmlp_digits"
    page.goto(f"{server.url}/models")
    row = page.locator("tr", has_text="gmlp twin from the form")
    assert row.locator("td", has_text="123").count() >= 1  # its seed tells it apart
    shot(page, results_dir, "23-model-uploaded")

    # What the API refuses is shown in one sentence under the form.
    page.goto(f"{server.url}/datasets")
    page.get_by_text("Upload a dataset").click()
    text = tmp_path / "notes.npz"
    text.write_bytes(b"just some text\n")
    page.locator('#dataset-upload input[name="file"]').set_input_files(str(text))
    page.get_by_role("button", name="Upload dataset").click()
    page.locator("#dataset-upload .form-error", has_text="is not an .npz archive").wait_for()


def test_api_docs_render_with_every_other_host_blocked(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
) -> None:
    own = urlsplit(server.url).netloc
    elsewhere: list[str] = []

    def only_this_server(route: Any) -> None:
        if urlsplit(route.request.url).netloc == own:
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto(server.url + "/docs")
    page.locator(".opblock-summary-path", has_text="/v1/comparisons").first.wait_for()
    assert page.locator(".opblock").count() > 20
    shot(page, results_dir, "24-api-docs-offline")
    page.goto(server.url + "/redoc")
    page.get_by_text("/v1/comparisons").first.wait_for()
    assert not elsewhere, f"the docs asked other hosts for {elsewhere}"


def test_deleting_a_used_model_asks_twice_naming_its_comparisons(
    page: Any,  # noqa: F811
    server: Server,
    results_dir: Path,
    tmp_path: Path,
) -> None:
    import models

    weights = models.save(models.create("mlp_digits", seed=77), tmp_path / "doomed.safetensors")
    with weights.open("rb") as w, weights.with_suffix(".json").open("rb") as s:
        r = server.api.post(
            "/v1/models", files={"weights": w, "sidecar": s}, data={"name": "doomed"}
        )
    assert r.status_code == 201, r.text
    doomed = r.json()["id"]
    body = {"model_ids": [doomed], "dataset_id": server.digits_id, "batch_size": 150}
    cmp = server.api.post("/v1/comparisons", json=body).json()["id"]

    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    sign_in(page, server, f"/models/{doomed}")
    page.get_by_role("button", name="Delete…").click()
    page.wait_for_url(re.compile(r"/models$"))
    assert len(asked) == 2 and "doomed" in asked[0]
    assert f"comparisons [{cmp}]" in asked[1]
    assert server.api.get(f"/v1/models/{doomed}").status_code == 404
    assert server.api.get(f"/v1/comparisons/{cmp}").status_code == 404
