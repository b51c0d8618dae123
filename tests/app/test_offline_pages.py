"""No page of the service references another host: every page is crawled and its assets fetched.

A researcher's laptop may have no network, and a page that loads a script from a CDN leaks
who reads what. The crawl starts at the home page and the API docs, follows every same-site
link to another page, and checks each tag's ``src``/``href``/``action`` and each asset.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

from fastapi.testclient import TestClient

from tests.helpers import digits_id, register, wait

# Attributes through which a page makes the browser fetch or go somewhere.
URL_ATTRIBUTE = re.compile(r'\b(src|href|action)="([^"]*)"')
# Paths that are data or downloads rather than pages to crawl further.
NOT_PAGES = ("/v1/", "/static/", "/docs/assets/", "/metrics", "/healthz", "/readyz", "/openapi")
ASSET_TAG = re.compile(r"<(?:script|link|img)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"")


def _crawl(client: TestClient, starts: list[str], limit: int = 80) -> dict[str, str]:
    seen: dict[str, str] = {}
    todo = deque(starts)
    while todo and len(seen) < limit:
        path = todo.popleft()
        if path in seen:
            continue
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code)
        seen[path] = r.text
        for _, url in URL_ATTRIBUTE.findall(r.text):
            target = url.split("#")[0]
            same_site = target.startswith("/") and not target.startswith("//")
            is_page = not target.startswith(NOT_PAGES) and "." not in target.rsplit("/", 1)[-1]
            if same_site and is_page:
                todo.append(target)
    return seen


def test_every_page_and_asset_stays_on_this_server(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    ids = register(client, zoo, "mixer_digits", "mlp_digits")
    r = client.post(
        "/v1/comparisons",
        json={"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150},
    )
    assert wait(client, r.headers["location"])["status"] == "succeeded"

    pages = _crawl(client, ["/", "/docs", "/redoc", "/jobs", "/login"])
    for must in ("/models", "/datasets", "/studies", "/jobs", f"/comparisons/{r.json()['id']}"):
        assert must in pages, f"the crawl never reached {must}"
    assets: set[str] = set()
    for path, html in pages.items():
        for attribute, url in URL_ATTRIBUTE.findall(html):
            assert not re.match(r"(?i)^(https?:|//|ftp:)", url), f"{path} {attribute}={url}"
        assets.update(ASSET_TAG.findall(html))
    assert any(a.startswith("/docs/assets/") for a in assets), assets
    for asset in sorted(assets):
        got = client.get(asset)
        assert got.status_code == 200, asset
        if asset.startswith("/static/"):  # our own scripts and styles: no remote fetches
            assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", got.text), asset
    # The documentation bundles mention other hosts; their pages' policy forbids loading any.
    for path in ("/docs", "/redoc"):
        policy = client.get(path).headers["content-security-policy"]
        assert "default-src 'self'" in policy and "http" not in policy


def test_the_openapi_schema_is_built_with_the_app_once_per_process(tmp_path: Path) -> None:
    """The first ``/docs`` does not wait for the schema: a thread builds it as the app is made,
    and every app of the process shares it (bench/bench_docs.py measures what it saves)."""
    import threading

    from app.http.main import create_app
    from tests.helpers import make_settings

    apps = [create_app(make_settings(f"sqlite:///{tmp_path / n}.db", tmp_path / n)) for n in "ab"]
    for thread in threading.enumerate():
        if thread.name == "openapi-schema":
            thread.join(timeout=120)
    assert apps[0].openapi_schema is not None  # no request asked for it
    assert apps[0].openapi() is apps[1].openapi()
    assert "/v1/comparisons" in apps[1].openapi()["paths"]
