"""Real checkpoints: timm/Hugging Face folders through REST and the CLI, compared on a folder of
photos of mixed sizes and modes, each model fed through its own pipeline; offline pretrained
weights from CKA_PRETRAINED_DIR."""

from __future__ import annotations

import io
import json
import socket
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from fastapi.testclient import TestClient
from PIL import Image
from safetensors.torch import save_file
from timm.data import resolve_data_config

from app.cli import main as cli_main
from app.store.settings import Settings
from tests.helpers import make_settings, wait
from tests.hub_helpers import (
    HUB_MODELS,
    N_IMAGES,
    StemRecorder,
    hub_folder,
    mixed_images,
    timm_input,
    zip_dir,
)


def _expected_pipeline(name: str) -> dict[str, Any]:
    cfg = resolve_data_config({}, model=timm.create_model(name, num_classes=10))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


# Two 224×224 timm networks through their own pipelines: the subject is the models and the
# photos, not the database (uploads and comparisons run on both in test_model_uploads.py and
# test_comparisons.py), so one database, the laptop's.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_hub_folders_compared_on_mixed_photos_through_rest(
    client: TestClient, tmp_path: Path
) -> None:
    photos = mixed_images(tmp_path)
    ids: dict[str, int] = {}
    for name in HUB_MODELS:
        _, folder = hub_folder(name, tmp_path)
        archive = zip_dir(folder, tmp_path / f"{name}.zip")
        r = client.post("/v1/models", files={"hub": (archive.name, archive.read_bytes())})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["arch"] == name and body["source"] == "hub"
        assert body["preprocessing"] == _expected_pipeline(name)
        assert body["default_layers"] == [f"blocks.{i}" for i in range(HUB_MODELS[name])]
        ids[name] = body["id"]
        page = client.get(f"/models/{body['id']}").text
        assert "Input pipeline" in page and "bicubic" in page
    photos_zip = zip_dir(photos, tmp_path / "photos.zip")
    r = client.post("/v1/datasets", files={"file": ("photos.zip", photos_zip.read_bytes())})
    assert r.status_code == 201, r.text
    dataset = r.json()
    assert dataset["n"] == N_IMAGES
    thumb = client.get(f"/datasets/{dataset['id']}/samples/0.png")
    with Image.open(io.BytesIO(thumb.content)) as shown:
        assert shown.size == (53, 37)  # the original file, not a model's 224×224 input

    services = client.app.state.services  # type: ignore[attr-defined]
    shas = {n: client.get(f"/v1/models/{i}").json()["sha256"] for n, i in ids.items()}
    recorders = {n: StemRecorder(services.models.get(sha)) for n, sha in shas.items()}
    try:
        r = client.post(
            "/v1/comparisons",
            json={"model_ids": list(ids.values()), "dataset_id": dataset["id"], "batch_size": 8},
        )
        assert r.status_code == 202, r.text
        done = wait(client, r.headers["location"], timeout=900)
    finally:
        for rec in recorders.values():
            rec.close()
    assert done["status"] == "succeeded", done
    assert done["diagnostics"]["n_used"] == N_IMAGES
    m = client.get(
        f"{r.headers['location']}/matrix", params={"a": "mixer_s16_224", "b": "resmlp_12_224"}
    ).json()
    assert np.array(m["values"], dtype=float).shape == (8, 12)
    first = photos / "a" / "000.png"
    for name, rec in recorders.items():
        assert rec.first is not None
        assert torch.equal(rec.first, timm_input(name, first)), name


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_64_px_npz_is_compared_with_a_224_px_model_through_its_pipeline(
    client: TestClient, tmp_path: Path
) -> None:
    """The issue's case: a 3×64×64 ``.npz`` and a 224-px timm model. The request is accepted,
    the model reads the array as its pipeline reads a PNG of the same pixels, and the
    comparison's provenance says so, with the array's value range."""
    _, folder = hub_folder("mixer_s16_224", tmp_path)
    archive = zip_dir(folder, tmp_path / "mixer.zip")
    r = client.post("/v1/models", files={"hub": (archive.name, archive.read_bytes())})
    assert r.status_code == 201, r.text
    model_id, sha = r.json()["id"], r.json()["sha256"]
    pixels = np.random.default_rng(1).integers(0, 256, size=(4, 64, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, x=pixels)
    r = client.post("/v1/datasets", files={"file": ("random64.npz", buf.getvalue())})
    assert r.status_code == 201, r.text
    assert r.json()["shape"] == [3, 64, 64]
    Image.fromarray(pixels[0], "RGB").save(tmp_path / "first.png")

    services = client.app.state.services  # type: ignore[attr-defined]
    recorder = StemRecorder(services.models.get(sha))
    try:
        r = client.post(
            "/v1/comparisons",
            json={"model_ids": [model_id], "dataset_id": r.json()["id"], "batch_size": 4},
        )
        assert r.status_code == 202, r.text
        done = wait(client, r.headers["location"], timeout=900)
    finally:
        recorder.close()
    assert done["status"] == "succeeded", done
    assert recorder.first is not None
    assert torch.equal(recorder.first, timm_input("mixer_s16_224", tmp_path / "first.png"))
    assert done["provenance"]["input"] == {
        "images": "array",
        "shape": [3, 64, 64],
        "value_range": {"low": 0.0, "high": 255.0, "from": "uint8"},
        "pipeline": ["mixer_s16_224"],
        "as_is": [],
    }


def test_pickle_folders_are_refused_with_the_conversion(client: TestClient, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("m/config.json", json.dumps({"architecture": "resmlp_12_224"}))
        zf.writestr("m/pytorch_model.bin", b"\x80\x02}q\x00.")
    r = client.post("/v1/models", files={"hub": ("m.zip", buf.getvalue())})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "pytorch_model.bin" in detail and "weights_only=True" in detail
    assert "save_file" in detail
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../config.json", "{}")
    r = client.post("/v1/models", files={"hub": ("e.zip", evil.getvalue())})
    assert r.status_code == 422 and "unsafe path" in r.json()["detail"]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network from Python: any socket connection fails (libpq is C and unaffected)."""

    def refuse(*_a: object, **_k: object) -> None:
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_pretrained_weights_come_from_the_operator_directory(
    db_url: str, tmp_path: Path, offline: None
) -> None:
    weights_dir = tmp_path / "pretrained"
    weights_dir.mkdir()
    torch.manual_seed(3)
    published = timm.create_model("resmlp_12_224")  # 1000 classes, as published
    save_file(
        {k: v.contiguous() for k, v in published.state_dict().items()},
        str(weights_dir / "resmlp_12_224.safetensors"),
    )
    settings: Settings = make_settings(db_url, tmp_path / "data", pretrained_dir=weights_dir)
    from app.http.main import create_app

    with TestClient(create_app(settings)) as c:
        form = {"timm_name": "resmlp_12_224", "config": json.dumps({"pretrained": True})}
        r = c.post("/v1/models", data=form)
        assert r.status_code == 201, r.text
        sha = r.json()["sha256"]
        loaded = c.app.state.services.models.get(sha)  # type: ignore[attr-defined]
        for key, value in published.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), key
        r = c.post("/v1/models", data={**form, "timm_name": "mixer_s16_224"})
        assert r.status_code == 422
        assert str(weights_dir / "mixer_s16_224.safetensors") in r.json()["detail"]
        bad = {"timm_name": "resmlp_12_224", "config": json.dumps({"pretrained": "http://x"})}
        assert c.post("/v1/models", data=bad).status_code == 422


def test_import_and_compare_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = mixed_images(tmp_path)
    checkpoints = []
    for name in HUB_MODELS:
        _, folder = hub_folder(name, tmp_path)
        source = zip_dir(folder, tmp_path / f"{name}.zip") if "mixer" in name else folder
        assert cli_main(["import", str(source), "--out", str(tmp_path / "ck")]) == 0
        checkpoints.append(str(tmp_path / "ck" / f"{name}.safetensors"))
    out = tmp_path / "atlas.json"
    args = ["compare", *checkpoints, "--dataset", str(photos), "--batch-size", "8"]
    assert cli_main([*args, "--out", str(out)]) == 0
    atlas = json.loads(out.read_text())
    assert atlas["n"] == N_IMAGES
    import analysis

    loaded = analysis.Atlas.from_dict(atlas)
    assert loaded.matrix("mixer_s16_224", "resmlp_12_224").shape == (8, 12)
    assert "mixer_s16_224" in capsys.readouterr().out
