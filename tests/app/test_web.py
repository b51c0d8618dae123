"""The web page without a browser: rendering, filters, pagination, sign-in and the cookie."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from analysis.options import option_specs
from app.http.main import create_app
from app.http.security import COOKIE_NAME
from app.http.web.catalog import sample_indices
from app.http.web.templating import code_spans, fold
from tests.helpers import digits_id, make_settings, register, upload, wait

TOKEN = "page-token"
STATIC = Path(__file__).resolve().parents[2] / "app" / "web" / "static"


def embedded_json(html: str, element_id: str) -> Any:
    match = re.search(
        rf'<script type="application/json" id="{element_id}">(.*?)</script>', html, re.S
    )
    assert match, f"no #{element_id} in the page"
    return json.loads(match.group(1))


def submit(client: TestClient, model_ids: list[int], dataset_id: int, **kw: Any) -> int:
    body = {"model_ids": model_ids, "dataset_id": dataset_id, "batch_size": 90, **kw}
    r = client.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[TestClient]:
    """SQLite app with a write token and no worker (jobs stay queued)."""
    settings = make_settings(
        f"sqlite:///{tmp_path / 'web.db'}", tmp_path / "data", api_tokens=TOKEN, worker_threads=0
    )
    with TestClient(create_app(settings)) as c:
        yield c


def test_finished_comparison_page(client: TestClient, zoo: dict[str, Path]) -> None:
    ids = register(client, zoo, "mixer_digits", "gmlp_digits")
    cid = submit(client, ids, digits_id(client))
    assert wait(client, f"/v1/comparisons/{cid}")["status"] == "succeeded"

    home = client.get("/")
    assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")
    assert f'href="/comparisons/{cid}"' in home.text
    assert "mixer_digits" in home.text and "gmlp_digits" in home.text

    page = client.get(f"/comparisons/{cid}")
    assert page.status_code == 200
    atlas = embedded_json(page.text, "atlas-data")
    stored = client.get(f"/v1/comparisons/{cid}/result").json()["atlas"]
    assert atlas["models"] == stored["models"] == ["mixer_digits", "gmlp_digits"]
    assert atlas["layers"] == stored["layers"]
    assert [(m["a"], m["b"], m["cka"]) for m in atlas["matrices"]] == [
        (m["a"], m["b"], m["cka"]) for m in stored["matrices"]
    ]
    assert len(atlas["matrices"]) == 3  # two within, one between
    meta = embedded_json(page.text, "comparison-meta")
    assert meta == {"id": cid, "status": "succeeded", "progress": 1.0}
    for link in ("/result", "/heatmap.png", "/heatmap.svg"):
        assert f'href="/v1/comparisons/{cid}{link}"' in page.text
    # Provenance and diagnostics are shown.
    assert stored["config"]["dataset"][:16] in page.text
    cache = stored["diagnostics"]["gram_cache"]
    blocks = f"HSIC blocks {cache['blocks_reused']} reused, {cache['blocks_computed']} computed"
    assert blocks in page.text


def test_scripts_and_styles_are_vendored(client: TestClient) -> None:
    page = client.get("/comparisons/new").text
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', page)
    assert sources and all(s.startswith("/static/") for s in sources), sources
    for name in (
        "svg.js",
        "heatmap.js",
        "comparison.js",
        "api.js",
        "new.js",
        "list.js",
        "style.css",
    ):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200
        # Nothing is fetched from another host (the SVG namespace is a name, not a fetch).
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", r.text), name
    csp = client.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'self'" in csp


def test_list_filters_and_pagination(
    idle_client: TestClient, zoo: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.http.web.common as pages  # every listing page's size

    monkeypatch.setattr(pages, "PAGE_SIZE", 2)
    c = idle_client
    mixer, gmlp = register(c, zoo, "mixer_digits", "gmlp_digits")
    ds = digits_id(c)
    linear_a = submit(c, [mixer], ds, batch_size=50)
    linear_b = submit(c, [mixer, gmlp], ds, batch_size=60)
    rbf = submit(c, [gmlp], ds, batch_size=70, kernel="rbf")

    def listed(query: str) -> list[int]:
        r = c.get("/" + query)
        assert r.status_code == 200, r.text
        return [int(x) for x in re.findall(r'<tr data-comparison-id="(\d+)"', r.text)]

    assert listed("") == [rbf, linear_b]  # newest first, two per page
    second = c.get("/?page=2").text
    assert re.findall(r'data-comparison-id="(\d+)"', second) == [str(linear_a)]
    assert "3–3 of 3 comparisons" in second and 'rel="prev"' in second
    assert listed("?kernel=rbf") == [rbf]
    assert listed("?kernel=linear") == [linear_b, linear_a]
    assert listed(f"?model={gmlp}") == [rbf, linear_b]
    assert listed("?status=queued&page=2") == [linear_a]
    assert listed("?status=queued&kernel=linear") == [linear_b, linear_a]
    assert listed("?status=succeeded") == []
    assert listed(f"?dataset={ds + 1}") == []
    # Malformed filters are ignored rather than answered with an error.
    assert listed("?model=abc&status=nonsense&page=-3") == [rbf, linear_b]
    first = c.get("/?status=queued").text
    assert 'href="/?status=queued&amp;page=2"' in first


def test_running_comparison_page_has_a_progress_bar(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    (mixer,) = register(idle_client, zoo, "mixer_digits")
    cid = submit(idle_client, [mixer], digits_id(idle_client))
    page = idle_client.get(f"/comparisons/{cid}").text
    assert embedded_json(page, "atlas-data") is None
    assert embedded_json(page, "comparison-meta")["status"] == "queued"
    assert re.search(r'id="progress"\s+role="progressbar"[^>]*aria-valuenow="0\.0000"', page)
    assert 'id="cancel"' in page  # no tokens configured: writes are open


def test_model_page_shows_architecture_omega_accuracy(client: TestClient, tmp_path: Path) -> None:
    import torch

    import models

    torch.manual_seed(0)
    net = models.create("sw_mlp_digits")
    path = models.save(
        net, tmp_path / "sw.safetensors", metrics={"test": {"accuracy": 0.9321, "loss": 0.25}}
    )
    r = upload(client, path, name="sparse one")
    model = r.json()
    page = client.get(f"/models/{model['id']}")
    assert page.status_code == 200
    assert "sparse one" in page.text and "sw_mlp_digits" in page.text
    assert f"{models.connections(net):,}" in page.text  # Ω
    assert f"{model['parameters']:,}" in page.text
    assert "93.2%" in page.text
    for layer in model["default_layers"]:
        assert f"<code>{layer}</code>" in page.text
    listing = client.get("/models?q=sparse").text
    assert f'href="/models/{model["id"]}"' in listing
    assert f'href="/models/{model["id"]}"' not in client.get("/models?q=zzz").text
    assert client.get("/models/99999").status_code == 404


def test_dataset_page_and_sample_images(client: TestClient) -> None:
    from analysis import load_dataset

    ds_id = digits_id(client)
    info = client.get(f"/v1/datasets/{ds_id}").json()
    page = client.get(f"/datasets/{ds_id}")
    assert page.status_code == 200
    assert info["sha256"] in page.text and "1 × 8 × 8" in page.text
    shown = [int(i) for i in re.findall(rf'src="/datasets/{ds_id}/samples/(\d+)\.png"', page.text)]
    data = load_dataset("digits", split="test")
    assert shown == sample_indices(data.y, len(data))
    assert [int(data.y[i]) for i in shown[:10]] == list(range(10))  # every class shows

    r = client.get(f"/datasets/{ds_id}/samples/{shown[3]}.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    img = Image.open(io.BytesIO(r.content))
    assert img.mode == "L" and img.size == (96, 96)  # 8×8 upscaled ×12, no blur
    pixels = np.asarray(img)[::12, ::12]
    expected = np.round(np.clip(data.x[shown[3], 0], 0, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(pixels, expected)
    again = client.get(
        f"/datasets/{ds_id}/samples/{shown[3]}.png", headers={"If-None-Match": r.headers["etag"]}
    )
    assert again.status_code == 304
    assert client.get(f"/datasets/{ds_id}/samples/{len(data)}.png").status_code == 404
    assert client.get("/datasets/99999").status_code == 404


def test_the_dataset_page_reads_only_the_images_it_shows(
    idle_client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uploaded .npz (sorted by class, so its samples lie far apart) and an ImageFolder
    zip: the page and each sample image are answered without the dataset ever being loaded
    (loading is made to fail here; before, the page loaded it whole, as float32), and each
    sample is the image the upload holds at that index, with its class."""
    import zipfile

    from app.http.web.samples import render_sample
    from app.store.services import Services

    c = idle_client
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(3), 40)  # classes in blocks: the first of class 2 is image 80
    x = rng.integers(0, 256, size=(120, 12, 10, 3), dtype=np.uint8)
    np.savez(tmp_path / "blocks.npz", x=x, y=y)
    pictures = {
        f"cls{k}/{i}.png": rng.integers(0, 256, (9, 7, 3), np.uint8)
        for k in range(2)
        for i in range(3)
    }
    with zipfile.ZipFile(tmp_path / "folder.zip", "w") as zf:
        for name, pixels in pictures.items():
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="PNG")
            zf.writestr(f"photos/{name}", buf.getvalue())
    ids = {}
    for name in ("blocks.npz", "folder.zip"):
        with (tmp_path / name).open("rb") as f:
            r = c.post("/v1/datasets", files={"file": (name, f)})
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]

    services: Services = c.app.state.services  # type: ignore[attr-defined]

    def refuse(key: str) -> None:
        raise AssertionError(f"the dataset page loaded the whole dataset {key}")

    monkeypatch.setattr(services.datasets, "_load", refuse)
    loads = services.datasets.loads  # the built-in digits, loaded once as the app started

    page = c.get(f"/datasets/{ids['blocks.npz']}").text
    shown = [int(i) for i in re.findall(r'/samples/(\d+)\.png"', page)]
    assert shown[:3] == [0, 40, 80] and len(shown) == 12
    for i in (0, 80, 119):
        r = c.get(f"/datasets/{ids['blocks.npz']}/samples/{i}.png")
        assert r.status_code == 200, r.text
        expected = render_sample(x[i].transpose(2, 0, 1).astype(np.float32) / 255.0)
        assert r.content == expected, i

    page = c.get(f"/datasets/{ids['folder.zip']}").text
    shown = [int(i) for i in re.findall(r'/samples/(\d+)\.png"', page)]
    assert shown == [0, 3, 1, 4, 2, 5] and "cls0" in page and "cls1" in page
    order = sorted(pictures)  # the folder's images in path order
    for i in (0, 4):
        r = c.get(f"/datasets/{ids['folder.zip']}/samples/{i}.png")
        img = Image.open(io.BytesIO(r.content))
        assert img.size == (7, 9)  # shown in its own size: never enlarged
        np.testing.assert_array_equal(np.asarray(img.convert("RGB")), pictures[order[i]])
    assert services.datasets.loads == loads


def test_sample_indices_cycle_through_classes() -> None:
    labels = np.array([1, 1, 0, 2, 0, 1])
    assert sample_indices(labels, 6, count=5) == [2, 0, 3, 4, 1]
    assert sample_indices(None, 30, count=4) == [0, 1, 2, 3]
    assert sample_indices(np.array([0, 0]), 2, count=12) == [0, 1]


def test_new_comparison_form(client: TestClient, zoo: dict[str, Path]) -> None:
    mixer, gmlp = register(client, zoo, "mixer_digits", "gmlp_digits")
    page = client.get(f"/comparisons/new?model={gmlp}").text
    boxes = dict(re.findall(r'name="model_ids" value="(\d+)"\s*(checked)?', page))
    assert boxes == {str(mixer): "", str(gmlp): "checked"}
    assert f'<option value="{digits_id(client)}">digits' in page
    assert 'name="dataset_id"' in page
    # One control per option of CompareOptions, in their order; the deprecated one left out.
    offered = re.findall(r'data-option="(\w+)" data-kind="(\w+)"', page)
    specs = option_specs()
    assert offered == [(n, s.kind) for n, s in specs.items() if not s.deprecated]
    assert specs["bootstrap"].deprecated and 'name="bootstrap"' not in page
    # Descriptions read with their code spans as code, never as raw backticks.
    assert "`" not in page and "<code>mutual_knn</code>" in page
    assert 'id="login-notice"' not in page  # no tokens: writes open


def test_sign_in_sets_an_httponly_cookie(secured: TestClient) -> None:
    c = secured
    assert 'href="/login?next=/"' in c.get("/").text  # reads are public
    new = c.get("/comparisons/new").text
    assert 'id="login-notice"' in new and re.search(r'id="submit"\s+disabled', new)

    wrong = c.post("/login", data={"token": "nope", "next": "/comparisons/new"})
    assert wrong.status_code == 401 and "not accepted" in wrong.text
    assert COOKIE_NAME not in wrong.cookies

    ok = c.post("/login", data={"token": TOKEN, "next": "/comparisons/new"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/comparisons/new"
    cookie = ok.headers["set-cookie"]
    assert f"{COOKIE_NAME}={TOKEN}" in cookie
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
        assert attribute.lower() in cookie.lower()
    assert TOKEN not in ok.headers["location"]
    signed = c.get("/comparisons/new").text
    assert "Signed in" in signed and 'id="login-notice"' not in signed

    c.post("/logout", follow_redirects=False)
    assert COOKIE_NAME not in c.cookies


def test_login_never_redirects_off_site(secured: TestClient) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        r = secured.post("/login", data={"token": TOKEN, "next": target}, follow_redirects=False)
        assert r.headers["location"] == "/", target


def test_cookie_writes_need_the_page_header(secured: TestClient, zoo: dict[str, Path]) -> None:
    c = secured
    r = upload(c, zoo["mixer_digits"], Authorization=f"Bearer {TOKEN}")
    assert r.status_code == 201, r.text
    model_id = r.json()["id"]
    body = {"model_ids": [model_id], "dataset_id": digits_id(c), "batch_size": 90}

    c.post("/login", data={"token": TOKEN})
    assert c.cookies.get(COOKIE_NAME) == TOKEN
    # A cross-site form can send the cookie but not a custom header: refused.
    assert c.post("/v1/comparisons", json=body).status_code == 401
    r = c.post("/v1/comparisons", json=body, headers={"X-CKA-CSRF": "1"})
    assert r.status_code == 202, r.text
    c.cookies.clear()
    assert c.post("/v1/comparisons", json=body, headers={"X-CKA-CSRF": "1"}).status_code == 401
    # A wrong cookie is no better than none.
    c.cookies.set(COOKIE_NAME, "forged")
    assert c.post("/v1/comparisons", json=body, headers={"X-CKA-CSRF": "1"}).status_code == 401


def test_reads_can_require_the_token(tmp_path: Path) -> None:
    settings = make_settings(
        f"sqlite:///{tmp_path / 'private.db'}",
        tmp_path / "data",
        api_tokens=TOKEN,
        read_requires_token=True,
        worker_threads=0,
    )
    with TestClient(create_app(settings)) as c:
        for path in ("/", "/models", "/datasets/1", "/comparisons/new"):
            r = c.get(path)
            assert r.status_code == 401 and 'action="/login"' in r.text, path
            assert f'name="next" value="{path}"' in r.text
        assert c.get("/v1/comparisons").status_code == 401
        assert c.get("/static/style.css").status_code == 200
        c.post("/login", data={"token": TOKEN})
        # The cookie opens pages and the page's own API reads (no header needed to read).
        assert c.get("/").status_code == 200
        assert c.get("/datasets/1").status_code == 200
        assert c.get("/v1/comparisons").status_code == 200
        assert c.get("/datasets/1/samples/0.png").status_code == 200


def test_form_bodies_over_the_limit_are_413(tmp_path: Path) -> None:
    settings = make_settings(
        f"sqlite:///{tmp_path / 'limit.db'}", tmp_path / "data", max_upload_bytes=1000
    )
    with TestClient(create_app(settings)) as c:
        r = c.post("/login", data={"token": "x" * 5000})
        assert r.status_code == 413
        assert r.headers["content-type"] == "application/problem+json"


def test_state_names_come_from_the_enum_never_retyped(idle_client: TestClient) -> None:
    """The page's scripts get the job states from base.html's JSON, rendered from JobState;
    no template, script or API filter spells a state name out."""
    from app.store.orm import JobState

    page = idle_client.get("/").text
    found = re.search(r'<script type="application/json" id="job-states">(.*?)</script>', page)
    assert found is not None
    assert json.loads(found.group(1)) == {
        "QUEUED": "queued",
        "RUNNING": "running",
        "SUCCEEDED": "succeeded",
        "FAILED": "failed",
        "CANCELLED": "cancelled",
        "LIVE": ["queued", "running"],
    }
    assert [s.value for s in JobState if s.live] == ["queued", "running"]
    root = Path(__file__).parents[2] / "app" / "http"
    names = "|".join(s.value for s in JobState)
    literal = re.compile(rf"""(["'])({names})\1|\^\(({names})\|""")
    files = [*root.glob("web/static/*.js"), *root.glob("web/templates/*.html")]
    files += list(root.glob("api/*.py"))
    retyped = {f.name: literal.findall(f.read_text()) for f in files}
    assert {name: hits for name, hits in retyped.items() if hits} == {}


def test_long_texts_fold_at_a_space_outside_code_spans() -> None:
    assert fold("short enough") == {"short": "short enough", "full": "short enough"}
    text = "word " * 20 + "`rbf:T (T, a positive number)` " + "tail " * 20
    short = fold(text, at=160)["short"]
    assert short == "word " * 19 + "word …"  # not "… `rbf:T (T, …": the span is whole or out
    assert len(fold("a" * 300)["short"]) == 300  # nowhere to cut: shown whole
    assert str(code_spans("`x` <b> `y")) == "<code>x</code> &lt;b&gt; `y"
