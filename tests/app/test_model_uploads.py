"""Uploading a model: a name sent with stored weights is kept as an alias, and every refusal
names the file the user sent and what is wrong with it."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.http.main import create_app
from tests.app.payloads import assert_problem
from tests.helpers import make_settings, upload


def test_stored_weights_sent_with_a_new_name_keep_it_as_an_alias(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    c = idle_client
    first = upload(c, zoo["mixer_digits"], name="mixer_first")
    assert first.status_code == 201 and first.json()["aliases"] == []
    model_id = first.json()["id"]
    for name, status in (("mixer_again", 200), ("mixer_again", 200), ("mixer_first", 200)):
        again = upload(c, zoo["mixer_digits"], name=name)
        assert again.status_code == status and again.json()["id"] == model_id
    assert upload(c, zoo["mixer_digits"]).json()["aliases"] == ["mixer_again"]  # no name sent
    body = c.get(f"/v1/models/{model_id}").json()
    assert body["name"] == "mixer_first" and body["aliases"] == ["mixer_again"]
    found = c.get("/v1/models", params={"q": "again"}).json()
    assert [m["id"] for m in found["items"]] == [model_id]
    assert c.get("/v1/models", params={"q": "nothing_like_it"}).json()["total"] == 0
    page = c.get(f"/models/{model_id}").text
    assert "Also uploaded as <strong>mixer_again</strong>" in page
    assert "also mixer_again" in c.get("/models").text
    assert c.delete(f"/v1/models/{model_id}").status_code == 204  # its aliases go with it
    fresh = upload(c, zoo["mixer_digits"], name="mixer_again")
    assert fresh.status_code == 201 and fresh.json()["aliases"] == []


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    """An app on SQLite without a worker: refusals do not depend on the database."""
    settings = make_settings(f"sqlite:///{tmp_path / 'cka.db'}", tmp_path / "data")
    with TestClient(create_app(settings.model_copy(update={"worker_threads": 0}))) as c:
        yield c


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _refusal(r: Any, field: str, code: str = "invalid_checkpoint") -> str:
    detail: str = assert_problem(r, 422, code, field)["detail"]
    assert (
        "/tmp" not in detail and "folder.zip" not in detail and "weights.safetensors" not in detail
    )
    return detail


def test_every_refusal_names_the_file_sent_and_its_fault(
    api: TestClient, zoo: dict[str, Path]
) -> None:
    weights = zoo["mixer_digits"].read_bytes()
    sidecar = zoo["mixer_digits"].with_suffix(".json").read_bytes()
    config = json.dumps({"architecture": "mixer_digits", "num_classes": 10}).encode()
    post = api.post

    # model folders (hub): the archive is named as sent, with what it lacks
    r = post("/v1/models", files={"hub": ("noconfig.zip", _zip({"m/model.safetensors": weights}))})
    detail = _refusal(r, "hub")
    assert detail.startswith("'noconfig.zip' holds no config.json"), detail
    two = _zip({"a/config.json": config, "b/config.json": config})
    detail = _refusal(post("/v1/models", files={"hub": ("two.zip", two)}), "hub")
    assert detail.startswith("'two.zip' holds 2 config.json files (a/config.json, b/config.json)")
    pth = _zip({"m/config.json": config, "m/pytorch_model.bin": b"\x80\x02."})
    detail = _refusal(post("/v1/models", files={"hub": ("pth.zip", pth)}), "hub")
    assert detail.startswith("'pytorch_model.bin' in 'pth.zip' is a pickle-based PyTorch file")
    wrong = _zip({"m/config.json": config, "m/model.safetensors": zoo["gmlp_digits"].read_bytes()})
    detail = _refusal(post("/v1/models", files={"hub": ("wrong.zip", wrong)}), "hub")
    assert "model.safetensors in 'wrong.zip'" in detail and "missing keys" in detail, detail
    detail = _refusal(post("/v1/models", files={"hub": ("notes.txt", b"hello")}), "hub")
    assert detail.startswith("'notes.txt' is not a zip archive")

    # weights: what is wrong with the file comes before what else is missing
    evil = pickle.dumps({"weights": [1, 2, 3]})
    detail = _refusal(post("/v1/models", files={"weights": ("model.pth", evil)}), "weights")
    assert detail.startswith("'model.pth' is a pickle-based PyTorch file") and "save_file" in detail
    detail = _refusal(post("/v1/models", files={"weights": ("notes.txt", b"hello")}), "weights")
    assert detail == "'notes.txt' is too short to be a safetensors file (5 bytes)"
    junk = b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"x" * 64
    detail = _refusal(post("/v1/models", files={"weights": ("junk.bin", junk)}), "weights")
    assert detail == "'junk.bin' is not a safetensors file: its header is not valid JSON"
    folder = _zip({"m/config.json": config, "m/model.safetensors": weights})
    detail = _refusal(post("/v1/models", files={"weights": ("m.zip", folder)}), "weights")
    assert detail.startswith("'m.zip' is a zipped model folder") and "send it as hub" in detail

    # a good file with the wrong company
    files: dict[str, Any] = {"weights": ("mixer.safetensors", weights)}
    detail = _refusal(post("/v1/models", files=files), "sidecar", "validation_error")
    assert (
        detail.startswith("the weights 'mixer.safetensors' need their sidecar")
        and "timm_name" in detail
    )
    files["sidecar"] = ("mixer.json", sidecar)
    r = post("/v1/models", files=files, data={"timm_name": "mixer_digits"})
    assert "not both" in _refusal(r, "sidecar", "validation_error")
    r = post("/v1/models", files={"sidecar": ("mixer.json", sidecar)})
    detail = _refusal(r, "weights", "validation_error")
    assert detail.startswith("'mixer.json' came without the weights it describes")
    detail = _refusal(
        post("/v1/models", data={"timm_name": "mixer_digits"}), "weights", "validation_error"
    )
    assert detail.startswith("timm_name 'mixer_digits' needs weights")
    detail = _refusal(post("/v1/models", data={"name": "x"}), "weights", "validation_error")
    assert detail.startswith("send a model: weights with their sidecar")
    files["sidecar"] = ("broken.json", b"{not json")
    detail = _refusal(post("/v1/models", files=files), "sidecar")
    assert detail == "the sidecar 'broken.json' is not valid JSON"
    files = {"weights": ("gmlp.safetensors", zoo["gmlp_digits"].read_bytes())}
    r = post("/v1/models", files=files, data={"timm_name": "mixer_digits"})
    detail = _refusal(r, "weights")
    assert detail.startswith("'gmlp.safetensors'") and "missing keys" in detail, detail
    assert api.get("/v1/models").json()["total"] == 0


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("key", "value"),
    [("std", NAN), ("mean", NAN), ("std", INF), ("std", -INF), ("mean", 1e308), ("std", 1e-30)],
)
def test_non_finite_or_huge_preprocessing_is_refused_on_upload_and_hub_import(
    api: TestClient, zoo: dict[str, Path], key: str, value: float
) -> None:
    """A pipeline mean or std that is NaN, infinite or beyond the documented bounds
    (models.preprocessing: |mean| <= 1000, std in [1e-3, 1e3]) is refused with 422 naming the
    field: in an uploaded sidecar's ``preprocessing`` and ``normalisation``, and in a hub
    folder's ``config.json`` ``pretrained_cfg``. Python's json reads and writes NaN and
    Infinity, as the issue's probe sent them."""
    weights = zoo["mixer_digits"].read_bytes()
    sidecar = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())
    channels = sidecar["input_shape"][0]
    pipeline = {
        "input_size": sidecar["input_shape"],
        "mean": [0.0] * channels,
        "std": [1.0] * channels,
    }
    for where in ("preprocessing", "normalisation"):
        bad = {**sidecar, where: {**pipeline, key: [value] * channels}}
        files = {
            "weights": ("w.safetensors", weights),
            "sidecar": ("s.json", json.dumps(bad).encode()),
        }
        detail = _refusal(api.post("/v1/models", files=files), "sidecar")
        assert f"field '{where}" in detail and key in detail, detail
    config = {"architecture": "mixer_digits", "num_classes": 10, "pretrained_cfg": {}}
    config["pretrained_cfg"] = {**pipeline, key: [value] * channels}
    folder = _zip({"m/config.json": json.dumps(config).encode(), "m/model.safetensors": weights})
    detail = _refusal(api.post("/v1/models", files={"hub": ("m.zip", folder)}), "hub")
    assert f"has a {key} of" in detail and "must be a number from" in detail, detail
    assert api.get("/v1/models").json()["total"] == 0
    # the bounds' own ends are accepted
    fine = {
        **sidecar,
        "preprocessing": {**pipeline, "mean": [1000.0] * channels, "std": [1e-3] * channels},
    }
    files = {
        "weights": ("w.safetensors", weights),
        "sidecar": ("s.json", json.dumps(fine).encode()),
    }
    assert api.post("/v1/models", files=files).status_code == 201
