"""Hostile input, round two (issue 26): one named test per attack on the HTTP side and the store.

Tampering with a stored model by re-uploading it, unbounded studies, cross-site writes in
open mode, a ``next`` that leaves the site, and labels that plots, exports and pages must
treat as text. Every test runs on SQLite and PostgreSQL (the ``db_url`` fixture) where it
touches the database.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

import analysis.studies
from app.http.main import create_app
from app.store.orm import Model
from app.store.services import Services
from app.store.settings import Settings
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, register, upload, wait


def _services(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


# --- a stored model is immutable ----------------------------------------------------------


def test_reupload_with_a_changed_sidecar_leaves_the_model_and_its_comparison_unchanged(
    client: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    ids = register(client, zoo, "mixer_digits", "rp_mixer_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    first = wait(client, client.post("/v1/comparisons", json=body).headers["location"])
    assert first["status"] == "succeeded"
    before = client.get(f"/v1/comparisons/{first['id']}/result").json()["atlas"]
    model = client.get(f"/v1/models/{ids[0]}").json()
    sha = model["sha256"]
    stored = _services(client).store.path(sha, ".json")
    stored_bytes = stored.read_bytes()

    # The same weights, with a sidecar whose pipeline would change every activation.
    meta = json.loads(zoo["mixer_digits"].with_suffix(".json").read_text())
    meta["preprocessing"] = {**meta["preprocessing"], "mean": [50.0], "std": [0.01]}
    tampered = tmp_path / "tampered.safetensors"
    tampered.write_bytes(zoo["mixer_digits"].read_bytes())
    tampered.with_suffix(".json").write_text(json.dumps(meta))
    body_409 = assert_problem(upload(client, tampered), 409, "model_exists", "sidecar")
    assert "preprocessing.mean" in body_409["detail"] and "preprocessing.std" in body_409["detail"]

    assert stored.read_bytes() == stored_bytes  # nothing written over the stored sidecar
    assert client.get(f"/v1/models/{ids[0]}").json() == model
    again = client.post("/v1/comparisons", json=body | {"force": True})
    second = wait(client, again.headers["location"])
    assert second["status"] == "succeeded" and second["id"] != first["id"]
    after = client.get(f"/v1/comparisons/{second['id']}/result").json()["atlas"]
    assert after["hsic"] == before["hsic"]

    # The same sidecar again (a re-save: only the file's own fields differ) is the same model.
    resaved = dict(json.loads(zoo["mixer_digits"].with_suffix(".json").read_text()))
    resaved["created"] = "2030-01-01T00:00:00Z"
    tampered.with_suffix(".json").write_text(json.dumps(resaved))
    r = upload(client, tampered)
    assert r.status_code == 200 and r.json()["id"] == ids[0]
    assert stored.read_bytes() == stored_bytes


# --- sizes bounded where they are parsed --------------------------------------------------

TINY = {
    "name": "tiny",
    "dataset": "digits",
    "seeds": 1,
    "reference": {"name": "mixer", "arch": "mixer_digits"},
    "arms": [{"name": "rp", "arch": "rp_mixer_digits"}],
}


def test_a_million_study_seeds_are_refused_before_anything_is_expanded(
    idle_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def expanded(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study was planned or its grid expanded")

    # the package's plan() (what the service calls) and the grid expansion inside it
    monkeypatch.setattr(analysis.studies, "plan", expanded)
    monkeypatch.setattr(importlib.import_module("analysis.studies.plan"), "_points", expanded)
    for seeds in (1_000_000, 3_000_000, 10**18):
        r = idle_client.post("/v1/studies", json={"spec": {**TINY, "seeds": seeds}})
        assert "seeds" in assert_problem(r, 422, "invalid_study")["detail"]
    # A list of seeds is bounded by its length, and so is a grid by its points, counted.
    many = list(range(129))
    r = idle_client.post("/v1/studies", json={"spec": {**TINY, "seeds": many}})
    assert "seeds" in assert_problem(r, 422, "invalid_study")["detail"]
    grid = {"density": [0.1] * 100, "depth": list(range(100)), "num_blocks": list(range(100))}
    arms = [{"name": "sw", "arch": "sw_mlp_digits", "grid": grid}]
    r = idle_client.post("/v1/studies", json={"spec": {**TINY, "arms": arms}})
    assert "1000001 architectures" in assert_problem(r, 422, "invalid_study")["detail"]
    assert idle_client.get("/v1/studies").json()["total"] == 0


@pytest.mark.parametrize(
    ("recipe", "field"),
    [
        ({"epochs": 100_000_000}, "epochs"),
        ({"batch_size": 10**9}, "batch_size"),
        ({"lr": 1e9}, "lr"),
    ],
)
def test_absurd_study_recipes_are_refused_with_the_trainings_limits(
    idle_client: TestClient, recipe: dict[str, Any], field: str
) -> None:
    for spec in ({**TINY, "recipe": recipe}, {**TINY, "quick": recipe}):
        r = idle_client.post("/v1/studies", json={"spec": spec, "quick": True})
        assert field in assert_problem(r, 422, "invalid_study")["detail"]
    arms = [{"name": "rp", "arch": "rp_mixer_digits", "recipe": recipe}]
    r = idle_client.post("/v1/studies", json={"spec": {**TINY, "arms": arms}})
    assert_problem(r, 422, "invalid_study")
    # The same value over /v1/trainings: the same limit.
    body = {"arch": "mixer_digits", "dataset_id": digits_id(idle_client), **recipe}
    assert_problem(idle_client.post("/v1/trainings", json=body), 422, "validation_error", field)
    assert idle_client.get("/v1/studies").json()["total"] == 0


# --- open mode refuses cross-origin writes; the Host is one of the service's names ---------

EVIL = "https://evil.example"


def _npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=np.zeros((8, 1, 8, 8), np.float32), y=np.zeros(8, np.int64))
    return buf.getvalue()


def test_a_cross_origin_write_in_open_mode_is_refused(client: TestClient) -> None:
    files = {"file": ("d.npz", _npz())}
    for headers in (
        {"Origin": EVIL},
        {"Origin": "null"},  # a sandboxed frame or a file:// page
        {"Origin": "http://testserver:8080"},  # another port is another origin
        {"Referer": f"{EVIL}/attack.html"},  # an old browser that sends no Origin
    ):
        r = client.post("/v1/datasets", files=files, headers=headers)
        assert_problem(r, 403, "cross_origin")
    assert client.get("/v1/datasets").json()["total"] == 1  # only the built-in digits
    same = client.post("/v1/datasets", files=files, headers={"Origin": "http://testserver"})
    assert same.status_code == 201, same.text
    assert client.post("/v1/datasets", files={"file": ("e.npz", _npz())}).status_code in (200, 201)


def test_a_cross_origin_write_with_a_token_is_refused_too(settings: Settings) -> None:
    secured = settings.model_copy(update={"api_tokens": "t" * 32})
    auth = {"Authorization": f"Bearer {'t' * 32}"}
    with TestClient(create_app(secured)) as c:
        r = c.post(
            "/v1/datasets", files={"file": ("d.npz", _npz())}, headers=auth | {"Origin": EVIL}
        )
        assert_problem(r, 403, "cross_origin")
        for path in ("/login", "/logout"):  # a cross-site form swapping or ending a session
            r = c.post(path, data={"token": "t" * 32}, headers={"Origin": EVIL})
            assert_problem(r, 403, "cross_origin")
            assert "set-cookie" not in r.headers


def test_a_rebound_host_name_is_refused(settings: Settings) -> None:
    with TestClient(create_app(settings)) as c:
        assert_problem(c.get("/v1/models", headers={"Host": "evil.example"}), 400, "invalid_host")
        assert_problem(
            c.post(
                "/v1/datasets",
                files={"file": ("d.npz", _npz())},
                headers={"Host": "evil.example:8000"},
            ),
            400,
            "invalid_host",
        )
        for name in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "testserver"):
            assert c.get("/v1/models", headers={"Host": name}).status_code == 200, name
    # Bound to every interface with no names configured (what `cka-atlas serve` refuses to
    # start: tests/test_deploy.py), only the localhost names are answered; configured names
    # are added to them.
    anywhere = settings.model_copy(update={"host": "0.0.0.0", "allowed_hosts": ""})
    with TestClient(create_app(anywhere)) as c:
        assert_problem(
            c.get("/v1/models", headers={"Host": "atlas.lab.example"}), 400, "invalid_host"
        )
        assert c.get("/v1/models", headers={"Host": "localhost:8000"}).status_code == 200
    named = anywhere.model_copy(update={"allowed_hosts": "atlas.lab.example"})
    with TestClient(create_app(named)) as c:
        assert c.get("/v1/models", headers={"Host": "atlas.lab.example"}).status_code == 200
        assert_problem(c.get("/v1/models", headers={"Host": "evil.example"}), 400, "invalid_host")


@pytest.mark.parametrize(
    "target",
    [
        "/\t/evil.example/",
        "/\n/evil.example",
        "/\\evil.example",
        "/ /evil.example",
        "https:evil.example",
    ],
)
def test_login_next_with_a_tab_stays_on_the_site(settings: Settings, target: str) -> None:
    with TestClient(create_app(settings)) as c:  # open mode: the page offers "Continue"
        page = c.get("/login", params={"next": target}).text
        assert 'href="/">Continue' in page and "evil.example" not in page
    secured = settings.model_copy(update={"api_tokens": "t" * 32})
    with TestClient(create_app(secured)) as c:
        r = c.post("/login", data={"token": "t" * 32, "next": target}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        r = c.post(
            "/login", data={"token": "t" * 32, "next": "/models?q=a"}, follow_redirects=False
        )
        assert r.headers["location"] == "/models?q=a"


# --- labels are text everywhere -------------------------------------------------------------

MATH = "$\\undefinedmacro{$"
FORMULA = '=HYPERLINK("https://evil.example","x")'


def _labelled_comparison(client: TestClient, zoo: dict[str, Path]) -> dict[str, Any]:
    ids = [
        upload(client, zoo["mixer_digits"], name=MATH).json()["id"],
        upload(client, zoo["rp_mixer_digits"], name=FORMULA).json()["id"],
    ]
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    done = wait(client, client.post("/v1/comparisons", json=body).headers["location"])
    assert done["status"] == "succeeded", done
    assert [m["label"] for m in done["models"]] == [MATH, FORMULA]
    return done


def test_a_math_text_model_name_renders_its_heatmap(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    done = _labelled_comparison(client, zoo)
    png = client.get(f"/v1/comparisons/{done['id']}/heatmap.png")
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    svg = client.get(f"/v1/comparisons/{done['id']}/heatmap.svg")
    assert svg.status_code == 200 and b"<svg" in svg.content[:500]


def test_a_formula_model_name_is_escaped_in_the_cell_exports(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    done = _labelled_comparison(client, zoo)
    text = client.get(f"/v1/comparisons/{done['id']}/cells.csv").text
    rows = list(csv.DictReader(io.StringIO(text)))
    names = {r["model_a"] for r in rows} | {r["model_b"] for r in rows}
    assert names == {MATH, "'" + FORMULA}
    labels = ("model_a", "layer_a", "model_b", "layer_b")
    assert not [r for r in rows for k in labels if r[k].startswith(("=", "+", "-", "@", "\t"))]
    table = pq.read_table(
        io.BytesIO(client.get(f"/v1/comparisons/{done['id']}/cells.parquet").content)
    )
    assert set(table.column("model_b").to_pylist()) == {MATH, "'" + FORMULA}


def test_the_catalog_survives_any_sidecar_value(client: TestClient, zoo: dict[str, Path]) -> None:
    """A model registered before sidecars had a schema: its metrics of any JSON type."""
    (model_id,) = register(client, zoo, "mixer_digits")
    services = _services(client)
    odd = {
        "test": {"accuracy": "ninety <b>percent</b>", "loss": [1]},
        "train": {"accuracy": 10**400},
    }
    with services.db.session() as s:
        row = s.get(Model, model_id)
        assert row is not None
        row.sidecar = {**row.sidecar, "metrics": odd, "training": {"epochs": {"x": 1}}, "seed": "s"}
    listing = client.get("/models")
    assert listing.status_code == 200
    assert "ninety &lt;b&gt;percent&lt;/b&gt;" in listing.text and "<b>percent" not in listing.text
    page = client.get(f"/models/{model_id}")
    assert page.status_code == 200 and "ninety &lt;b&gt;" in page.text
