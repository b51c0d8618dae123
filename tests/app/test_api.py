"""REST API: resources, pagination, problem+json errors, auth and upload limits."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from app.http.main import create_app
from app.store.settings import Settings
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, register, upload, wait


def test_builtin_digits_and_architectures(client: TestClient) -> None:
    ds = client.get(f"/v1/datasets/{digits_id(client)}").json()
    assert ds["builtin"] and ds["shape"] == [1, 8, 8] and ds["n"] == 450
    page = client.get("/v1/architectures", params={"family": "preset", "limit": 3}).json()
    assert page["total"] == 12 and len(page["items"]) == 3 and page["limit"] == 3
    mixer = client.get("/v1/architectures/mixer_digits").json()
    assert mixer["input_shape"] == [1, 8, 8] and mixer["default_layers"]
    tiny10 = client.get("/v1/architectures/tiny10_digits").json()  # a CNN: no tokens, no Ω
    assert tiny10["input_shape"] == [1, 8, 8] and len(tiny10["default_layers"]) == 9
    assert_problem(client.get("/v1/architectures/nope"), 404, "not_found")


def test_model_upload_list_download_delete(client: TestClient, zoo: dict[str, Path]) -> None:
    r = upload(client, zoo["mixer_digits"], name="m1")
    assert r.status_code == 201 and r.headers["location"] == f"/v1/models/{r.json()['id']}"
    model = r.json()
    assert model["arch"] == "mixer_digits" and model["input_shape"] == [1, 8, 8]
    assert (
        model["sha256"]
        == json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())["weights_sha256"]
    )
    again = upload(client, zoo["mixer_digits"])
    assert again.status_code == 200 and again.json()["id"] == model["id"]
    weights = client.get(f"/v1/models/{model['id']}/weights")
    assert weights.content == zoo["mixer_digits"].read_bytes()
    assert client.delete(f"/v1/models/{model['id']}").status_code == 204
    assert_problem(client.get(f"/v1/models/{model['id']}"), 404, "not_found")


def test_pagination_on_lists(client: TestClient, zoo: dict[str, Path]) -> None:
    register(client, zoo, *zoo)
    seen = []
    for offset in range(0, 5, 2):
        page = client.get("/v1/models", params={"limit": 2, "offset": offset}).json()
        assert page["total"] == 5 and page["offset"] == offset and page["limit"] == 2
        seen += [m["id"] for m in page["items"]]
    assert len(set(seen)) == 5
    assert client.get("/v1/models", params={"arch": "gmlp_digits"}).json()["total"] == 1
    assert_problem(client.get("/v1/models", params={"limit": 0}), 422, "validation_error", "limit")
    for url in ("/v1/datasets", "/v1/comparisons", "/v1/trainings", "/v1/architectures"):
        assert {"items", "total", "limit", "offset"} <= set(client.get(url).json())


def test_problem_json_for_bad_input(
    client: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    assert_problem(client.get("/v1/models/999"), 404, "not_found")
    assert_problem(client.get("/v1/models/abc"), 422, "validation_error", "model_id")
    assert_problem(client.get("/v1/nowhere"), 404, "not_found")
    assert_problem(client.put("/v1/models"), 405, "method_not_allowed")
    ids = register(client, zoo, "mixer_digits")
    ds = digits_id(client)
    post = lambda **kw: client.post("/v1/comparisons", json={"dataset_id": ds, **kw})  # noqa: E731
    assert_problem(post(model_ids=[999]), 422, "unknown_model", "model_ids.0")
    assert_problem(post(model_ids=[]), 422, "validation_error", "model_ids")
    assert_problem(post(model_ids=ids, batch_size=3), 422, "batch_too_small", "batch_size")
    assert_problem(post(model_ids=ids, layers="nothing.*"), 422, "invalid_layers", "layers")
    # the options' own checks name their problem (as analysis.CompareOptions does)
    assert_problem(post(model_ids=ids, kernel="poly"), 422, "invalid_kernel", "kernel")
    body = assert_problem(
        post(model_ids=ids, feature="mean_token"), 422, "validation_error", "feature"
    )
    assert body["detail"] == (
        "feature: Input should be 'flatten', 'mean_tokens' or 'cls', not 'mean_token'; "
        "did you mean 'mean_tokens'?"
    )
    assert_problem(post(model_ids=ids, extra=1), 422, "validation_error", "extra")
    r = client.post(
        "/v1/comparisons", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    # A pickle posing as a checkpoint is refused before anything loads it.
    evil = pickle.dumps({"weights": [1, 2, 3]})
    files = {"weights": ("w.safetensors", evil), "sidecar": ("s.json", b"{}")}
    assert_problem(client.post("/v1/models", files=files), 422, "invalid_checkpoint", "weights")
    # A sidecar naming an unknown architecture.
    side = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text()) | {"arch": "nope"}
    files = {
        "weights": ("w.safetensors", zoo["mixer_digits"].read_bytes()),
        "sidecar": ("s.json", json.dumps(side).encode()),
    }
    assert client.post("/v1/models", files=files).status_code == 422
    # Images of another shape than the models' are no mistake: each model's pipeline resizes
    # them (tests/analysis/test_model_inputs.py, tests/app/test_hub.py).
    buf = io.BytesIO()
    np.savez(buf, x=np.random.default_rng(0).random((8, 3, 16, 16)).astype(np.float32))
    r = client.post("/v1/datasets", files={"file": ("rgb.npz", buf.getvalue())})
    assert r.status_code == 201, r.text
    r = client.post("/v1/comparisons", json={"model_ids": ids, "dataset_id": r.json()["id"]})
    assert r.status_code == 202, r.text
    bad = client.post("/v1/datasets", files={"file": ("x.npz", b"not an archive")})
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"


def test_models_are_named_by_name_alias_or_id(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    """A comparison names its models by id, by name or by alias (issue 47); the stored
    request holds ids, so naming them another way finds the same comparison. A name no model
    has, or that several have, is refused in one sentence that says where models are listed."""
    client = idle_client
    mixer, sw = register(client, zoo, "mixer_digits", "sw_mlp_digits")
    assert upload(client, zoo["mixer_digits"], name="my_mixer").status_code == 200  # an alias
    ds = digits_id(client)
    post = lambda models: client.post(  # noqa: E731
        "/v1/comparisons", json={"model_ids": models, "dataset_id": ds, "batch_size": 150}
    )
    first = post(["mixer_digits", sw])
    assert first.status_code == 202, first.text
    view = client.get(first.headers["location"]).json()
    assert [m["id"] for m in view["models"]] == [mixer, sw]
    for same in (["my_mixer", "sw_mlp_digits"], [mixer, str(sw)]):
        again = post(same)
        assert again.status_code == 200 and again.json()["id"] == view["id"], same
    body = assert_problem(post(["mixr_digits"]), 422, "unknown_model", "model_ids.0")
    assert body["detail"] == (
        "no model is named 'mixr_digits'; GET /v1/models lists the models "
        "(?q=NAME finds names and aliases)"
    )
    assert upload(client, zoo["rp_mixer_digits"], name="twin").status_code == 201
    other = upload(client, zoo["gmlp_digits"], name="twin").json()["id"]
    body = assert_problem(post([mixer, "twin"]), 422, "ambiguous_model", "model_ids.1")
    assert body["detail"].startswith(f"2 models are named 'twin' (ids {other - 1}, {other}): ")
    assert_problem(post([mixer, "my_mixer"]), 422, "duplicate_model", "model_ids")


def test_model_options_that_fetch_weights_are_refused(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    # timm would download from a URL / the hub, or open a server-side path, for these.
    side = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())
    weights = zoo["mixer_digits"].read_bytes()
    for extra in (
        {"pretrained": True, "pretrained_cfg_overlay": {"url": "http://127.0.0.1:9/w.pth"}},
        {"checkpoint_path": "/etc/hostname"},
        {"cache_dir": "/tmp"},
    ):
        bad = side | {"config": side["config"] | extra}
        files = {"weights": ("w.safetensors", weights), "sidecar": ("s.json", json.dumps(bad))}
        body = assert_problem(
            client.post("/v1/models", files=files), 422, "invalid_checkpoint", "sidecar"
        )
        assert sorted(extra)[0] in body["detail"]
    files = {"weights": ("w.safetensors", weights)}
    data = {"timm_name": "mixer_s16_224", "config": json.dumps({"checkpoint_path": "/x"})}
    assert_problem(
        client.post("/v1/models", files=files, data=data), 422, "invalid_checkpoint", "config"
    )
    assert client.get("/v1/models").json()["total"] == 0


def test_delete_refused_while_used_unless_forced(client: TestClient, zoo: dict[str, Path]) -> None:
    ids = register(client, zoo, "mixer_digits", "mlp_digits")
    r = client.post(
        "/v1/comparisons",
        json={"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150},
    )
    wait(client, r.headers["location"])
    used = assert_problem(client.delete(f"/v1/models/{ids[0]}"), 409, "model_in_use", "force")
    assert str(r.json()["id"]) in used["detail"]  # names the comparisons that force would delete
    assert_problem(client.delete(f"/v1/datasets/{digits_id(client)}"), 409, "builtin_dataset")
    assert client.delete(f"/v1/models/{ids[0]}", params={"force": "true"}).status_code == 204
    assert client.get(r.headers["location"]).status_code == 404
    assert client.get(f"/v1/models/{ids[1]}").status_code == 200


def test_tokens_and_upload_limit(settings: Settings, zoo: dict[str, Path]) -> None:
    secured = settings.model_copy(
        update={
            "api_tokens": "s3cret, other",
            "max_upload_bytes": 4096,
            "read_requires_token": False,
        }
    )
    with TestClient(create_app(secured)) as c:
        tiny = {"file": ("x.npz", b"PK")}
        assert_problem(c.post("/v1/datasets", files=tiny), 401, "unauthorized", "Authorization")
        wrong = {"Authorization": "Bearer nope"}
        assert_problem(c.delete("/v1/models/1", headers=wrong), 401, "unauthorized")
        assert c.get("/v1/models").status_code == 200  # reads stay public
        ok = {"Authorization": "Bearer other"}
        big = {"file": ("big.npz", b"\0" * 10_000)}
        assert_problem(c.post("/v1/datasets", files=big, headers=ok), 413, "payload_too_large")
    private = secured.model_copy(update={"read_requires_token": True})
    with TestClient(create_app(private)) as c:
        assert_problem(c.get("/v1/models"), 401, "unauthorized")
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_openapi_is_complete(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/v1/architectures",
        "/v1/models",
        "/v1/models/{model_id}/weights",
        "/v1/datasets",
        "/v1/trainings",
        "/v1/comparisons",
        "/v1/comparisons/{comparison_id}/matrix",
        "/v1/comparisons/{comparison_id}/heatmap.{fmt}",
        "/v1/comparisons/{comparison_id}/cancel",
    ):
        assert path in paths, path
    assert "examples" in spec["components"]["schemas"]["ComparisonIn"]
    assert (
        "application/problem+json"
        in paths["/v1/models/{model_id}"]["get"]["responses"]["404"]["content"]
    )
