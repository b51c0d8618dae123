"""Dataset uploads answer what is wrong in one sentence, report what they hold, and are checked
in memory that does not grow with the dataset (issue 36)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from app.http.main import create_app
from app.store.settings import Settings
from tests.app.payloads import assert_problem
from tests.app.upload_memory import make
from tests.files import npz_bytes, png_bytes, zip_bytes


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


def test_a_flat_zip_is_a_dataset_to_compare_but_not_to_train_on(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    """Images at the top of a zip are a dataset without classes: uploaded, compared, and
    refused for training in one sentence (issue 47)."""
    rng = np.random.default_rng(0)
    pngs = [(f"{i}.png", png_bytes(rng.integers(0, 256, (8, 8), np.uint8))) for i in range(6)]
    r = client.post("/v1/datasets", files={"file": ("random_flat.zip", zip_bytes(pngs))})
    assert r.status_code == 201, r.text
    ds = r.json()
    assert (ds["n"], ds["classes"], ds["shape"]) == (6, None, [1, 8, 8])
    files = {
        "weights": ("w.safetensors", zoo["mlp_digits"].read_bytes()),
        "sidecar": ("s.json", zoo["mlp_digits"].with_suffix(".json").read_bytes()),
    }
    model = client.post("/v1/models", files=files).json()["id"]
    body = {"model_ids": [model], "dataset_id": ds["id"], "batch_size": 6}
    assert client.post("/v1/comparisons", json=body).status_code == 202
    training = {"arch": "mlp_digits", "dataset_id": ds["id"], "epochs": 1}
    refused = assert_problem(
        client.post("/v1/trainings", json=training), 422, "dataset_unlabelled", "dataset_id"
    )
    assert refused["detail"].startswith(f"dataset {ds['id']} (random_flat) has no labels")


def test_uploads_that_unpack_to_100_mb_take_less_than_twice_that(tmp_path: Path) -> None:
    """The API process's peak RSS (a process of its own, ru_maxrss) while it checks a .npz of
    0.1 MB and an ImageFolder zip of 0.1 MB that each unpack to 100 MB: at most twice that above
    idle. (Before, the .npz took 13 times that, and the probe's 500 MB one 6.5 GB; RELIABILITY.md
    has the 500 MB case, which this module runs by hand.)"""
    unpacked = make(tmp_path, 100_000_000)
    assert all((tmp_path / name).stat().st_size < 1 << 20 for name in unpacked)
    files = [str(tmp_path / name) for name in unpacked]
    done = subprocess.run(
        [sys.executable, "-m", "tests.app.upload_memory", str(tmp_path / "data"), *files],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    for upload in report["uploads"]:
        assert upload["status"] == 201, upload
        added = upload["peak"] - report["idle"]
        assert added <= 2 * unpacked[upload["file"]], (upload["file"], added / 1e6, "MB")
    shapes = {u["file"]: (u["body"]["n"], u["body"]["shape"]) for u in report["uploads"]}
    assert shapes == {"zeros.npz": (32552, [3, 32, 32]), "black.zip": (25, [1, 2000, 2000])}


def test_a_dataset_over_the_budget_is_refused_from_its_headers(settings: Settings) -> None:
    small = settings.model_copy(update={"max_dataset_bytes": 1000})
    fits = npz_bytes(x=np.zeros((3, 8, 8), np.uint8))  # 768 bytes as float32
    bomb = npz_bytes(x=np.zeros((4, 8, 8), np.uint8))  # 1024
    with TestClient(create_app(small)) as client:
        assert client.post("/v1/datasets", files={"file": ("fits.npz", fits)}).status_code == 201
        r = client.post("/v1/datasets", files={"file": ("bomb.npz", bomb)})
        body = assert_problem(r, 422, "dataset_too_large", "file")
        assert body["detail"] == (
            "'bomb.npz' holds 4 images of 1×8×8: 1024 bytes as float32, more than the 1000 bytes "
            "allowed by CKA_MAX_DATASET_BYTES."
        )


def test_a_zip_with_duplicate_member_names_is_refused_in_one_sentence(client: TestClient) -> None:
    """The probe's zip: 30 entries, 10 of them repeating a name, was stored as 20 images with
    no word said. Which of two files of one name is the image cannot be told: 422, counted."""
    import warnings
    import zipfile

    from PIL import Image

    def png(shade: int) -> bytes:
        out = io.BytesIO()
        Image.new("L", (8, 8), shade).save(out, format="PNG")
        return out.getvalue()

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of the duplicate names
        for i in range(20):
            zf.writestr(f"photos/{'cats' if i % 2 else 'dogs'}/{i}.png", png(i))
        for i in range(10):
            zf.writestr(f"photos/{'cats' if i % 2 else 'dogs'}/{i}.png", png(200 + i))
    files = {"file": ("twice.zip", buf.getvalue())}
    before = client.get("/v1/datasets").json()["total"]
    body = assert_problem(client.post("/v1/datasets", files=files), 422, "invalid_dataset", "file")
    detail = body["detail"]
    assert "'twice.zip' holds 10 entries whose path another entry already has" in detail, detail
    assert "photos/dogs/0.png" in detail and detail.count(". ") == 0
    assert client.get("/v1/datasets").json()["total"] == before  # nothing stored
