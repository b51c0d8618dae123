"""Dataset uploads answer what is wrong in one sentence, and report what they hold."""

from __future__ import annotations

import io

import numpy as np
from fastapi.testclient import TestClient

from tests.app.payloads import assert_problem


def test_a_file_that_is_not_an_npz_archive_says_so_in_one_sentence(client: TestClient) -> None:
    files = {"file": ("my_images.npz", b"x,y\n1,2\n")}
    body = assert_problem(client.post("/v1/datasets", files=files), 422, "invalid_dataset", "file")
    assert "'my_images.npz' is not an .npz archive" in body["detail"]
    # numpy's internals (its pickle advice) and the scratch file's name stay out of the answer.
    assert "pickle" not in body["detail"] and "upload" not in body["detail"]
    assert body["detail"].count(". ") == 0 and body["detail"].endswith(".")


def test_an_npz_with_labels_reports_its_classes(client: TestClient) -> None:
    rng = np.random.default_rng(0)
    y = np.array([0, 3, 1, 3, 2, 0, 1, 2])  # four classes, 0 … 3
    buf = io.BytesIO()
    np.savez(buf, x=rng.random((8, 1, 8, 8)).astype(np.float32), y=y)
    r = client.post("/v1/datasets", files={"file": ("four.npz", buf.getvalue())})
    assert r.status_code == 201, r.text
    ds = client.get(r.headers["location"]).json()
    assert ds["classes"] == ["0", "1", "2", "3"]
