"""Storage GC: deletes release unshared Grams, blocks and heatmaps; ``cka-atlas gc`` the rest."""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from analysis import load_dataset
from analysis.data import images as images_module
from app.cli import main
from app.store.services import Services
from app.store.settings import Settings
from tests.files import npz_bytes, png_bytes, zip_bytes
from tests.helpers import digits_id, register, wait

BATCH = 150  # digits test split: 450 images -> 3 batches


def _grams(services: Services) -> dict[Path, int]:
    return {p: p.stat().st_size for p in services.store.grams.rglob("*.safetensors")}


def _compare(client: TestClient, ids: list[int], dataset_id: int) -> dict[str, object]:
    body = {"model_ids": ids, "dataset_id": dataset_id, "batch_size": BATCH}
    done = wait(client, client.post("/v1/comparisons", json=body).headers["location"])
    assert done["status"] == "succeeded", done
    return done


def test_deleting_a_model_removes_its_artifacts_and_keeps_shared_ones(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    a, b, c = register(client, zoo, "mixer_digits", "mlp_digits", "gmlp_digits")
    ds = digits_id(client)
    first = _compare(client, [a, b], ds)
    after_first = _grams(services)
    # per batch: the Grams of a and b, the a-a, a-b, b-b blocks, and the analytic null's
    # per-layer numbers of a and of b
    assert len(after_first) == 3 * (2 + 3 + 2)
    png = client.get(f"/v1/comparisons/{first['id']}/heatmap.png")
    assert png.status_code == 200
    (heatmap,) = services.store.blobs.rglob("*.png")
    view = client.get(f"/v1/comparisons/{first['id']}").json()
    assert view["size_bytes"] == sum(after_first.values()) + len(png.content)

    second = _compare(client, [a, c], ds)  # reuses a's Grams and a-a blocks
    after_second = _grams(services)
    assert len(after_second) == 3 * (3 + 5 + 3)  # plus c's Grams, a-c, c-c blocks, null numbers
    assert client.get(f"/v1/models/{a}").json()["artifact_bytes"] == sum(
        after_second.values()
    ) + len(png.content)
    kept = set(after_second) - set(after_first)
    weights = services.store.path(client.get(f"/v1/models/{b}").json()["sha256"], ".safetensors")
    assert weights.exists()

    assert client.delete(f"/v1/models/{b}", params={"force": "true"}).status_code == 204
    left = _grams(services)
    # b's Grams, null numbers and the a-b and b-b blocks are gone; a's Grams, null numbers and
    # the a-a blocks, which the second comparison also references, stay, as does everything the
    # second one wrote.
    assert len(left) == len(after_second) - 3 * 4
    assert kept <= set(left) and set(left) <= set(after_second)
    assert not heatmap.exists()
    assert not weights.exists()
    view = client.get(f"/v1/comparisons/{second['id']}").json()
    assert view["size_bytes"] == sum(left.values())
    matrix = client.get(f"/v1/comparisons/{second['id']}/matrix").json()
    assert matrix["values"]  # the surviving comparison still reads


def test_deleting_a_dataset_removes_the_artifacts_over_it(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    (a,) = register(client, zoo, "mlp_digits")
    digits = load_dataset("digits", split="test")
    upload = npz_bytes(x=digits.x[:300], y=digits.y[:300])
    ds = client.post("/v1/datasets", files={"file": ("d.npz", upload)}).json()["id"]
    _compare(client, [a], digits_id(client))
    before = _grams(services)
    _compare(client, [a], ds)
    # a's Grams, a-a blocks and null numbers, 2 batches
    assert len(_grams(services)) == len(before) + 2 * 3
    assert client.delete(f"/v1/datasets/{ds}", params={"force": "true"}).status_code == 204
    assert _grams(services) == before


def _decoded(services: Services) -> set[Path]:
    return set(services.store.decoded.rglob("*.npy"))


def test_photos_are_decoded_once_kept_by_reference_and_released(
    client: TestClient, zoo: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zip of photos of several sizes: the first comparison decodes them into the store's
    ``decoded/``; a second one, of another model with the same pipeline, decodes nothing;
    the decoded pixels go when the last comparison that read them is deleted."""
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    a, b = register(client, zoo, "mlp_digits", "mixer_digits")  # both read 1×8×8 images
    rng = np.random.default_rng(0)
    photos: list[tuple[zipfile.ZipInfo | str, bytes]] = [
        (f"photos/{i}.png", png_bytes(rng.integers(0, 256, (9 + i, 12), np.uint8)))
        for i in range(8)
    ]
    upload = client.post("/v1/datasets", files={"file": ("photos.zip", zip_bytes(photos))})
    assert upload.status_code == 201, upload.text
    ds = upload.json()["id"]
    first = _compare(client, [a], ds)
    (kept,) = _decoded(services)
    assert np.load(kept).shape == (8, 1, 8, 8)
    decodes: list[int] = []
    original = images_module.open_image

    def counted(*args: Any, **kwargs: Any) -> Any:
        decodes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(images_module, "open_image", counted)
    second = _compare(client, [b], ds)
    assert decodes == [] and _decoded(services) == {kept}
    view = client.get(f"/v1/comparisons/{second['id']}").json()
    assert view["size_bytes"] >= kept.stat().st_size  # its references include the pixels
    assert client.delete(f"/v1/comparisons/{first['id']}").status_code == 204
    assert kept.exists()  # the second comparison read them too
    assert client.delete(f"/v1/comparisons/{second['id']}").status_code == 204
    assert not kept.exists()


def test_gc_removes_orphans_and_stale_temporaries(
    client: TestClient,
    zoo: dict[str, Path],
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    ids = register(client, zoo, "mlp_digits")
    _compare(client, ids, digits_id(client))
    live = _grams(services)
    blobs = sorted(p for p in services.store.blobs.rglob("*") if p.is_file())
    old = time.time() - 7200
    store = services.store
    orphan_gram = store.grams / "ab" / ("ab" * 32 + ".safetensors")
    orphan_blob = store.path("cd" * 32, ".png")
    orphan_pixels = store.decoded / "ef" / ("ef" * 32 + ".npy")
    stale_part = store.tmp / "upload.part"
    stale_scratch = store.tmp / "tmpdead"
    fresh_part = store.tmp / "fresh.part"
    killed_writer = store.grams / "ab" / "half.tmp"
    for path in (orphan_gram, orphan_blob, orphan_pixels, stale_part, fresh_part, killed_writer):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
    (stale_scratch / "model.safetensors").parent.mkdir(parents=True)
    (stale_scratch / "model.safetensors").write_bytes(b"y" * 7)
    orphans = (orphan_gram, orphan_blob, orphan_pixels, stale_part, stale_scratch, killed_writer)
    for path in (*orphans, *live, *blobs):
        os.utime(path, (old, old))  # referenced files as old as the orphans: age alone is no reason
    monkeypatch.setenv("CKA_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("CKA_DATA_DIR", str(settings.data_dir))

    assert main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove 6 files, 57 bytes" in out
    assert orphan_gram.exists() and stale_part.exists()

    assert main(["gc"]) == 0
    assert "removed 6 files, 57 bytes" in capsys.readouterr().out
    for gone in orphans:
        assert not gone.exists(), gone
    assert fresh_part.exists()  # younger than the grace period: perhaps an upload in progress
    assert _grams(services) == live and all(p.exists() for p in blobs)
    assert client.get(f"/v1/models/{ids[0]}/weights").status_code == 200
    np.testing.assert_equal(len(client.get("/v1/comparisons").json()["items"]), 1)
