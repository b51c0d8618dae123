"""Hostile and malformed input (issue 6): one named case per attack, against the real app.

Every case runs on SQLite and on PostgreSQL (the ``db_url`` fixture) and asserts the status,
the ``application/problem+json`` content type, the stable ``code`` and, where there is one,
the offending ``field``. Nothing here may be answered with a 5xx, and no upload may write
anything outside the artifact store or unpickle anything.
"""

from __future__ import annotations

import io
import json
import pickle
import stat
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from analysis import DatasetError
from analysis.data.datasets import load_image_folder, load_npz
from app.http.main import create_app
from tests.app.payloads import (
    WritesMarker,
    assert_problem,
    checkpoint_files,
    files_under,
    npy_bytes,
    safetensors_bytes,
)
from tests.files import npz_bytes, png_bytes, zip_bytes
from tests.helpers import digits_id, make_settings, upload

TOKEN = "hostile-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 2 * 1024 * 1024  # max_upload_bytes: room for a digits checkpoint, not for much more


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def api(db_url: str, root: Path) -> Iterator[TestClient]:
    """The app with a write token (sent by default) and no worker: jobs stay queued."""
    settings = make_settings(
        db_url, root / "data", api_tokens=TOKEN, worker_threads=0, max_upload_bytes=LIMIT
    )
    with TestClient(create_app(settings, start_worker=False), headers=AUTH) as client:
        yield client


@pytest.fixture
def mixer(api: TestClient, zoo: dict[str, Path]) -> int:
    r = upload(api, zoo["mixer_digits"])
    assert r.status_code in (200, 201), r.text
    return int(r.json()["id"])


def outside_store(root: Path) -> set[Path]:
    """Files under the test's directory, except the artifact store and the SQLite database."""
    store = root / "data"
    return {p for p in files_under(root) if store not in p.parents and "cka.db" not in p.name}


def post_dataset(api: TestClient, payload: bytes, filename: str = "upload.zip") -> Any:
    return api.post("/v1/datasets", files={"file": (filename, payload)})


def assert_refused_dataset(api: TestClient, root: Path, payload: bytes, filename: str) -> str:
    """The upload is a 422 naming ``file``, and it left no file behind, in or out of the store."""
    before_out, before_blobs = outside_store(root), files_under(root / "data" / "blobs")
    body = assert_problem(post_dataset(api, payload, filename), 422, "invalid_dataset", "file")
    assert outside_store(root) == before_out
    assert files_under(root / "data" / "blobs") == before_blobs
    assert files_under(root / "data" / "tmp") == set()  # the scratch copy is gone too
    return str(body["detail"])


def post_comparison(api: TestClient, **body: Any) -> Any:
    return api.post("/v1/comparisons", json={"dataset_id": digits_id(api), **body})


# --- checkpoints that are not what they claim ---------------------------------------------------


def test_torch_save_archive_posing_as_a_checkpoint(api: TestClient, zoo: dict[str, Path]) -> None:
    buffer = io.BytesIO()
    torch.save(load_file(str(zoo["mixer_digits"])), buffer)
    files = {
        "weights": ("w.safetensors", buffer.getvalue()),
        "sidecar": ("s.json", zoo["mixer_digits"].with_suffix(".json").read_bytes()),
    }
    body = assert_problem(api.post("/v1/models", files=files), 422, "invalid_checkpoint", "weights")
    assert "pickle" in body["detail"]


@pytest.mark.parametrize("route", ["sidecar", "timm", "dataset"])
def test_pickle_whose_reduce_writes_a_file_is_never_unpickled(
    api: TestClient, zoo: dict[str, Path], root: Path, route: str
) -> None:
    marker = root / "unpickled.txt"
    evil = pickle.dumps(WritesMarker(marker))
    if route == "sidecar":
        files = {
            "weights": ("w.safetensors", evil),
            "sidecar": ("s.json", zoo["mixer_digits"].with_suffix(".json").read_bytes()),
        }
        r = api.post("/v1/models", files=files)
        assert_problem(r, 422, "invalid_checkpoint", "weights")
    elif route == "timm":
        r = api.post(
            "/v1/models",
            files={"weights": ("w.safetensors", evil)},
            data={"timm_name": "mixer_digits"},
        )
        assert_problem(r, 422, "invalid_checkpoint", "weights")
    else:
        assert_refused_dataset(api, root, evil, "x.npz")
    assert not marker.exists()


def test_safetensors_header_whose_offsets_lie_beyond_the_file(
    api: TestClient, zoo: dict[str, Path]
) -> None:
    header = {"head.bias": {"dtype": "F32", "shape": [10], "data_offsets": [0, 1 << 40]}}
    files = {
        "weights": ("w.safetensors", safetensors_bytes(header, b"\0" * 40)),
        "sidecar": ("s.json", zoo["mixer_digits"].with_suffix(".json").read_bytes()),
    }
    body = assert_problem(api.post("/v1/models", files=files), 422, "invalid_checkpoint", "weights")
    assert "head.bias" in body["detail"]


def test_safetensors_header_length_of_two_to_the_62(api: TestClient) -> None:
    weights = safetensors_bytes({}, b"", declared=2**62)
    r = api.post(
        "/v1/models", files={"weights": ("w", weights)}, data={"timm_name": "mixer_digits"}
    )
    body = assert_problem(r, 422, "invalid_checkpoint", "weights")
    assert "header length" in body["detail"]


def test_safetensors_header_nested_too_deep_to_parse(api: TestClient) -> None:
    raw = b"[" * 100_000 + b"]" * 100_000
    weights = struct.pack("<Q", len(raw)) + raw
    r = api.post(
        "/v1/models", files={"weights": ("w", weights)}, data={"timm_name": "mixer_digits"}
    )
    assert_problem(r, 422, "invalid_checkpoint", "weights")


def test_sidecar_naming_an_unknown_architecture(api: TestClient, zoo: dict[str, Path]) -> None:
    meta = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text()) | {"arch": "mixer_xxl"}
    files = {
        "weights": ("w.safetensors", zoo["mixer_digits"].read_bytes()),
        "sidecar": ("s.json", json.dumps(meta).encode()),
    }
    body = assert_problem(api.post("/v1/models", files=files), 422, "invalid_checkpoint", "sidecar")
    assert "unknown architecture 'mixer_xxl'" in body["detail"]


@pytest.mark.parametrize(
    ("config", "needle"),
    [({"patch_size": 0}, "patch_size"), ({"no_such_option": 1}, "no_such_option")],
)
def test_sidecar_config_that_cannot_build(
    api: TestClient, zoo: dict[str, Path], config: dict[str, Any], needle: str
) -> None:
    meta = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())
    meta["config"] = meta["config"] | config
    files = {
        "weights": ("w.safetensors", zoo["mixer_digits"].read_bytes()),
        "sidecar": ("s.json", json.dumps(meta).encode()),
    }
    body = assert_problem(api.post("/v1/models", files=files), 422, "invalid_checkpoint", "sidecar")
    assert needle in body["detail"] and "/tmp" not in body["detail"]  # no server paths


def test_weights_with_wrong_shapes(api: TestClient, zoo: dict[str, Path]) -> None:
    state = load_file(str(zoo["mixer_digits"]))
    state["head.weight"] = torch.zeros(5, state["head.weight"].shape[1])
    files = checkpoint_files(state, zoo["mixer_digits"].with_suffix(".json"))
    body = assert_problem(api.post("/v1/models", files=files), 422, "invalid_checkpoint", "weights")
    assert "head.weight (checkpoint (5, 32), model (10, 32))" in body["detail"]


def test_weights_with_missing_keys(api: TestClient, zoo: dict[str, Path]) -> None:
    state = load_file(str(zoo["mixer_digits"]))
    del state["norm.weight"]
    files = checkpoint_files(state, zoo["mixer_digits"].with_suffix(".json"))
    body = assert_problem(api.post("/v1/models", files=files), 422, "invalid_checkpoint", "weights")
    assert "missing keys: norm.weight" in body["detail"]


def test_timm_upload_with_an_unknown_name_or_unbuildable_config(
    api: TestClient, zoo: dict[str, Path]
) -> None:
    weights = {"weights": ("w.safetensors", zoo["mixer_digits"].read_bytes())}
    r = api.post("/v1/models", files=weights, data={"timm_name": "resnet_from_mars"})
    assert_problem(r, 422, "invalid_checkpoint", "timm_name")
    for config in ('{"patch_size": 0}', '{"num_classes": "ten"}'):
        r = api.post(
            "/v1/models", files=weights, data={"timm_name": "mixer_digits", "config": config}
        )
        assert_problem(r, 422, "invalid_checkpoint", "config")
    nested = "[" * 9000 + "]" * 9000  # deeper than Python's recursion limit
    r = api.post("/v1/models", files=weights, data={"timm_name": "mixer_digits", "config": nested})
    assert_problem(r, 422, "validation_error", "config")


def test_oversized_or_nested_sidecar(api: TestClient, zoo: dict[str, Path]) -> None:
    weights = ("w.safetensors", zoo["mixer_digits"].read_bytes())
    for sidecar in (b"[" * 100_000, b'{"pad": "' + b"x" * (1024 * 1024) + b'"}'):
        r = api.post("/v1/models", files={"weights": weights, "sidecar": ("s.json", sidecar)})
        assert_problem(r, 422, "invalid_checkpoint", "sidecar")


# --- dataset archives ---------------------------------------------------------------------------

PNG = png_bytes(np.zeros((8, 8), np.uint8))


@pytest.mark.parametrize(
    "member", ["../evil.png", "a/../../evil.png", "/tmp/evil.png", "\\evil.png", "C:/a/evil.png"]
)
def test_zip_slip_paths(api: TestClient, root: Path, member: str) -> None:
    archive = zip_bytes([("a/0.png", PNG), (member, PNG)])
    assert "unsafe path" in assert_refused_dataset(api, root, archive, "slip.zip")
    assert not Path("/tmp/evil.png").exists() and not (root / "evil.png").exists()


def test_symlink_in_a_dataset_archive(api: TestClient, root: Path) -> None:
    link = zipfile.ZipInfo("a/link.png")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = zip_bytes([("a/0.png", PNG), (link, b"/etc/passwd")])
    assert "symbolic link" in assert_refused_dataset(api, root, archive, "link.zip")


def test_zip_bomb_member(api: TestClient, root: Path) -> None:
    bomb = zip_bytes([("a/0.png", PNG), ("a/1.png", b"\0" * 50_000_000)])
    assert len(bomb) < LIMIT
    assert "suspiciously well" in assert_refused_dataset(api, root, bomb, "bomb.zip")


def test_npz_array_declaring_more_than_it_holds(api: TestClient, root: Path) -> None:
    # np.load allocates what the header declares (here 64 TB) before it reads any data.
    archive = zip_bytes([("x.npy", npy_bytes((10**12, 8, 8), b"\0" * 1024))])
    assert "declares shape" in assert_refused_dataset(api, root, archive, "lying.npz")


def test_npz_that_unpacks_past_the_limit_is_refused_before_loading() -> None:
    archive = npz_bytes(x=np.zeros((64, 8, 8), np.uint8))
    with pytest.raises(DatasetError, match="unpacks to more than 1000 bytes"):
        load_npz(archive, max_bytes=1000)


def test_image_folder_decoding_past_the_budget_is_refused() -> None:
    # Small PNGs can declare large canvases; the decoded total is bounded before decoding.
    archive = zip_bytes([(f"a/{i}.png", png_bytes(np.zeros((64, 64), np.uint8))) for i in range(4)])
    with pytest.raises(DatasetError, match="decode to more than"):
        load_image_folder(archive, max_bytes=3 * 64 * 64)


def test_filename_with_path_separators_is_only_a_label(api: TestClient, root: Path) -> None:
    before = outside_store(root)
    payload = npz_bytes(x=np.random.default_rng(0).random((6, 1, 8, 8)).astype(np.float32))
    r = post_dataset(api, payload, "../../../../tmp/evil.npz")
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "evil"
    assert outside_store(root) == before and not Path("/tmp/evil.npz").exists()


# --- upload size --------------------------------------------------------------------------------


def test_upload_over_the_limit_is_413(api: TestClient) -> None:
    big = b"\0" * (LIMIT + 1)
    assert_problem(post_dataset(api, big, "big.npz"), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the body is cut off as it streams
        for _ in range(LIMIT // 65536 + 2):
            yield b"\0" * 65536

    r = api.post(
        "/v1/datasets",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert_problem(r, 413, "payload_too_large")
    # A Content-Length that understates the body does not get it past the counter.
    r = api.post(
        "/v1/datasets",
        content=big,
        headers={"content-type": "multipart/form-data; boundary=x", "content-length": "10"},
    )
    assert_problem(r, 413, "payload_too_large")


def test_json_body_over_a_mebibyte_is_413(api: TestClient) -> None:
    # A JSON body is parsed whole before validation: it has its own, much smaller, limit.
    r = post_comparison(api, model_ids=list(range(1, 300_000)))
    assert_problem(r, 413, "payload_too_large")
    assert "1048576 bytes" in r.json()["detail"]


# --- datasets that are not image batches --------------------------------------------------------


@pytest.mark.parametrize(
    ("arrays", "needle"),
    [
        ({"x": np.full((4, 8, 8), np.nan, np.float32)}, "NaN or infinite"),
        ({"x": np.full((4, 8, 8), np.inf, np.float32)}, "NaN or infinite"),
        ({"x": np.zeros((4, 8), np.float32)}, "must be (N, H, W)"),
        ({"x": np.zeros((2, 2, 2, 2, 2), np.float32)}, "must be (N, H, W)"),
        ({"x": np.zeros((0, 8, 8), np.uint8)}, "holds no samples"),
        ({"x": np.array([{"a": 1}], dtype=object)}, "not a readable .npz"),
    ],
    ids=["nan", "inf", "rank-2", "rank-5", "zero-samples", "object-array"],
)
def test_dataset_that_is_not_an_image_batch(
    api: TestClient, root: Path, arrays: dict[str, np.ndarray], needle: str
) -> None:
    assert needle in assert_refused_dataset(api, root, npz_bytes(**arrays), "bad.npz")


# --- comparison requests ------------------------------------------------------------------------


def test_a_layer_that_matches_nothing_is_answered_with_where_to_look(
    api: TestClient, mixer: int
) -> None:
    """One line: the closest names, the model's layers folded into ranges, and the URL that
    lists them all, which does."""
    body = assert_problem(
        post_comparison(api, model_ids=[mixer], layers="blocks.20"), 422, "invalid_layers", "layers"
    )
    detail = body["detail"]
    listed = api.get(f"/v1/models/{mixer}/layers").json()
    blocks = [f"blocks.{i}" for i in range(4)]
    assert listed["default_layers"] == ["stem", *blocks, "norm", "pre_logits"]
    assert {"blocks.3.mlp_tokens.fc1", "pre_logits", "head"} <= set(listed["layers"])
    assert "\n" not in detail and detail.startswith(
        f"layer selection 'blocks.20' matches no layer of model {mixer} (mixer_digits); "
        "closest: blocks.2, blocks.0, blocks.3; "
        f"its {len(listed['layers'])} layers: stem, stem.proj, stem.norm, blocks, "
        "blocks.0–blocks.3, blocks.*.norm1,"
    )
    assert detail.endswith(f"; GET /v1/models/{mixer}/layers lists them all")


@pytest.mark.timeout(60)
def test_pathological_layer_glob_is_answered_at_once(api: TestClient, mixer: int) -> None:
    # A backtracking regex needs longer than the age of the universe for these.
    for glob in ("*" * 200, "**" * 100, "*?" * 100):
        r = post_comparison(api, model_ids=[mixer], layers=glob[:199] + "x")
        assert_problem(r, 422, "invalid_layers", "layers")


def test_layers_of_the_wrong_type(api: TestClient, mixer: int) -> None:
    for layers in (True, {"a": 1}, [[1]], ["x" * 201], 10**30):
        r = post_comparison(api, model_ids=[mixer], layers=layers)
        assert_problem(r, 422, "validation_error", "layers")


def test_batch_below_four_with_the_unbiased_estimator(api: TestClient, mixer: int) -> None:
    r = post_comparison(api, model_ids=[mixer], batch_size=3, estimator="unbiased")
    assert_problem(r, 422, "batch_too_small", "batch_size")


def test_huge_lists_and_numbers_in_a_comparison(api: TestClient, mixer: int) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model_ids": list(range(1, 100_001))}, "model_ids"),
        ({"layers": ["blocks.0"] * 10_000}, "layers"),
        ({"bootstrap": 10**9}, "bootstrap"),
        ({"bootstrap": -1}, "bootstrap"),
        ({"batch_size": 10**12}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"model_ids": [2**63]}, "model_ids.0"),
        ({"dataset_id": 2**64}, "dataset_id"),
        ({"model_ids": [mixer, mixer]}, "model_ids"),
    ]
    for extra, field in cases:
        r = post_comparison(api, **({"model_ids": [mixer]} | extra))
        assert r.status_code == 422 and r.json()["field"] == field, (extra, r.text)
        assert r.headers["content-type"] == "application/problem+json"


def test_comparisons_too_large_for_a_worker(
    api: TestClient, mixer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.jobs.submit

    monkeypatch.setattr(app.jobs.submit, "MAX_TOTAL_LAYERS", 10)
    r = post_comparison(api, model_ids=[mixer], layers="**")
    assert_problem(r, 422, "too_many_layers", "layers")
    monkeypatch.setattr(app.jobs.submit, "MEMORY_BUDGET_BYTES", 1 << 20)
    r = post_comparison(api, model_ids=[mixer], batch_size=450)
    assert_problem(r, 422, "batch_too_large", "batch_size")
    r = post_comparison(api, model_ids=[mixer], mode="full", batch_size=16)
    assert_problem(r, 422, "batch_too_large", "mode")
    r = post_comparison(api, model_ids=[mixer], batch_size=16, interval="batches", resamples=1000)
    assert_problem(r, 422, "bootstrap_too_large", "resamples")
    assert api.get("/v1/comparisons").json()["total"] == 0


def test_training_with_out_of_range_numbers(api: TestClient) -> None:
    ds = digits_id(api)
    for extra, field in [
        ({"epochs": 0}, "epochs"),
        ({"epochs": 10**9}, "epochs"),
        ({"seed": -1}, "seed"),
        ({"batch_size": 10**9}, "batch_size"),
        ({"lr": 0}, "lr"),
        ({"arch": ""}, "arch"),
        ({"arch": "no_such_net"}, "arch"),
    ]:
        r = api.post("/v1/trainings", json={"arch": "mixer_digits", "dataset_id": ds} | extra)
        assert r.status_code == 422 and r.json()["field"] == field, (extra, r.text)


# --- ids ----------------------------------------------------------------------------------------

MISSING = 424242
UNKNOWN_ID_REQUESTS = [
    ("GET", f"/v1/models/{MISSING}"),
    ("GET", f"/v1/models/{MISSING}/weights"),
    ("GET", f"/v1/models/{MISSING}/sidecar"),
    ("DELETE", f"/v1/models/{MISSING}"),
    ("GET", f"/v1/datasets/{MISSING}"),
    ("DELETE", f"/v1/datasets/{MISSING}"),
    ("GET", f"/v1/comparisons/{MISSING}"),
    ("DELETE", f"/v1/comparisons/{MISSING}"),
    ("POST", f"/v1/comparisons/{MISSING}/cancel"),
    ("GET", f"/v1/comparisons/{MISSING}/result"),
    ("GET", f"/v1/comparisons/{MISSING}/matrix"),
    ("GET", f"/v1/comparisons/{MISSING}/heatmap.png"),
    ("GET", f"/v1/comparisons/{MISSING}/heatmap.svg"),
    ("GET", f"/v1/trainings/{MISSING}"),
    ("POST", f"/v1/trainings/{MISSING}/cancel"),
]


def test_ids_that_do_not_exist_are_404(api: TestClient) -> None:
    for method, url in UNKNOWN_ID_REQUESTS:
        body = assert_problem(api.request(method, url), 404, "not_found")
        assert str(MISSING) in body["detail"], url


@pytest.mark.parametrize("ident", [2**31, 2**63, 2**64 + 1, 10**40, 0, -1])
def test_ids_outside_the_key_range_are_422(api: TestClient, ident: int) -> None:
    for method, url in UNKNOWN_ID_REQUESTS:
        url = url.replace(str(MISSING), str(ident))
        param = {"models": "model_id", "datasets": "dataset_id", "trainings": "training_id"}.get(
            url.split("/")[2], "comparison_id"
        )
        assert_problem(api.request(method, url), 422, "validation_error", param)
    r = api.get("/v1/comparisons", params={"model_id": 2**63})
    assert_problem(r, 422, "validation_error", "model_id")


# --- text that PostgreSQL cannot store ----------------------------------------------------------


def test_nul_bytes_in_text_fields(api: TestClient, zoo: dict[str, Path]) -> None:
    for url, field in [
        ("/v1/models", "q"),
        ("/v1/models", "arch"),
        ("/v1/datasets", "q"),
        ("/v1/comparisons", "kernel"),
        ("/v1/architectures", "q"),
    ]:
        assert_problem(api.get(url, params={field: "a\x00b"}), 422, "validation_error", field)
    r = upload(api, zoo["mixer_digits"], name="evil\x00name")
    assert_problem(r, 422, "validation_error", "name")
    for bad in (r"a\u0000", r"\ud800"):  # NUL, and an unpaired surrogate (not encodable)
        body = f'{{"arch": "mixer_digits", "dataset_id": {digits_id(api)}, "name": "{bad}"}}'
        r = api.post("/v1/trainings", content=body, headers={"content-type": "application/json"})
        assert_problem(r, 422, "validation_error", "name")
    # A sidecar's own name with a NUL is stored without it; NULs deeper in it are kept.
    meta = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())
    meta |= {"name": "m\x00x", "notes": {"a\x00": ["b\x00"]}}
    files = {
        "weights": ("w.safetensors", zoo["mixer_digits"].read_bytes()),
        "sidecar": ("s.json", json.dumps(meta).encode()),
    }
    r = api.post("/v1/models", files=files)
    assert r.status_code == 201 and r.json()["name"] == "mx", r.text
    assert api.get(f"/v1/models/{r.json()['id']}/sidecar").json()["notes"] == {"a\x00": ["b\x00"]}


def test_body_that_is_not_json_or_not_utf8(api: TestClient) -> None:
    headers = {"content-type": "application/json"}
    assert_problem(
        api.post("/v1/comparisons", content=b"{not json", headers=headers), 422, "validation_error"
    )
    assert_problem(
        api.post("/v1/trainings", content=b'{"arch": "\xff"}', headers=headers), 400, "bad_request"
    )
    assert_problem(
        api.post("/v1/comparisons", content=b"[" * 100_000, headers=headers), 400, "bad_request"
    )


# --- tokens -------------------------------------------------------------------------------------

WRITES = [
    ("POST", "/v1/comparisons"),
    ("POST", "/v1/trainings"),
    ("POST", "/v1/models"),
    ("POST", "/v1/datasets"),
    ("DELETE", "/v1/models/1"),
    ("DELETE", "/v1/datasets/1"),
    ("DELETE", "/v1/comparisons/1"),
    ("POST", "/v1/comparisons/1/cancel"),
    ("POST", "/v1/trainings/1/cancel"),
]


@pytest.mark.parametrize(
    ("authorization", "challenge"),
    [
        (None, 'Bearer realm="cka-atlas"'),
        ("Bearer wrong", 'Bearer realm="cka-atlas", error="invalid_token"'),
        ("Bearer", 'Bearer realm="cka-atlas"'),
        (f"Basic {TOKEN}", 'Bearer realm="cka-atlas"'),
    ],
    ids=["missing", "wrong", "empty", "not-bearer"],
)
def test_writes_without_a_valid_token_are_401(
    api: TestClient, authorization: str | None, challenge: str
) -> None:
    for method, url in WRITES:
        headers = {"Authorization": authorization} if authorization else {}
        if authorization is None:
            api.headers.pop("Authorization", None)
        r = api.request(method, url, headers=headers)
        assert_problem(r, 401, "unauthorized", "Authorization")
        assert r.headers["www-authenticate"] == challenge, (method, url)
    assert api.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_reads_need_a_token_when_configured(db_url: str, root: Path) -> None:
    settings = make_settings(
        db_url, root / "data", api_tokens=TOKEN, read_requires_token=True, worker_threads=0
    )
    with TestClient(create_app(settings, start_worker=False)) as c:
        for url in ("/v1/models", "/v1/datasets/1", "/v1/comparisons", "/v1/architectures"):
            r = c.get(url)
            assert_problem(r, 401, "unauthorized", "Authorization")
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert c.get(url, headers=AUTH).status_code == 200
        assert_problem(
            c.get("/v1/models", headers={"Authorization": "Bearer x"}), 401, "unauthorized"
        )


# --- the web pages ------------------------------------------------------------------------------


def test_pages_with_out_of_range_ids_or_nul_filters(api: TestClient) -> None:
    # Pages answer HTML, never 422: an id no row can have is a 404 page, a bad filter is ignored.
    huge = 2**70
    for url in (f"/models/{huge}", f"/datasets/{huge}", f"/comparisons/{huge}", "/models/0"):
        r = api.get(url)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), url
    assert api.get(f"/datasets/{huge}/samples/0.png").status_code == 404
    for url, params in [
        ("/", {"page": str(huge), "model": str(huge), "kernel": "a\x00"}),
        ("/models", {"q": "a\x00b", "page": str(huge)}),
        ("/datasets", {"page": str(-huge)}),
    ]:
        assert api.get(url, params=params).status_code == 200, url
