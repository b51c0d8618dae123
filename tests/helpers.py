"""Helpers shared by the service tests: settings, uploads through the API, waiting for jobs.

Fixtures live in the conftest files; everything a test imports lives here.
"""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.jobs.embedded import EmbeddedWorker
from app.store.orm import Comparison
from app.store.services import Services
from app.store.settings import Settings

DIGITS = ("mixer_digits", "sw_mlp_digits", "rp_mixer_digits", "gmlp_digits", "mlp_digits")
FINAL = ("succeeded", "failed", "cancelled")


def make_settings(db_url: str, data_dir: Path, **kw: Any) -> Settings:
    """Settings for an app under test: one worker thread, fast polls, CPU, no broker."""
    base: dict[str, Any] = {
        "database_url": db_url,
        "data_dir": data_dir,
        "worker_threads": 1,
        "poll_s": 0.1,
        "heartbeat_s": 0.2,
        "device": "cpu",
        "broker_url": None,
        "api_tokens": "",
        "allowed_hosts": "testserver",  # the Host TestClient sends
    }
    return Settings(**(base | kw))


def upload(client: TestClient, path: Path, name: str | None = None, **headers: str) -> Any:
    """POST a checkpoint (weights and its JSON sidecar) to /v1/models; the response."""
    with path.open("rb") as w, path.with_suffix(".json").open("rb") as s:
        files = {"weights": ("w.safetensors", w), "sidecar": ("s.json", s)}
        data = {"name": name} if name else {}
        return client.post("/v1/models", files=files, data=data, headers=headers)


def register(client: TestClient, zoo: dict[str, Path], *names: str) -> list[int]:
    """Upload the named checkpoints of ``zoo``; their model ids, in order."""
    ids = []
    for name in names:
        r = upload(client, zoo[name])
        assert r.status_code in (200, 201), r.text
        ids.append(r.json()["id"])
    return ids


def digits_id(client: TestClient) -> int:
    """The id of the built-in digits dataset."""
    items = client.get("/v1/datasets", params={"q": "digits"}).json()["items"]
    return int(items[0]["id"])


def wait(
    client: TestClient,
    url: str,
    timeout: float = 120.0,
    alive: subprocess.Popen[bytes] | None = None,
) -> dict[str, Any]:
    """Poll ``url`` until its job ends; fail at once if the worker process ``alive`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(url).json()
        if body["status"] in FINAL:
            return body
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the worker exited with {alive.returncode} before {url} ended")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not finish: {body}")
        time.sleep(0.05)


def run_until_final(
    client: TestClient, services: Services, url: str, timeout: float = 120.0
) -> dict[str, Any]:
    """Run one embedded worker thread until the job behind ``url`` ends; its final view."""
    worker = EmbeddedWorker(services, threads=1)
    worker.start()
    try:
        return wait(client, url, timeout)
    finally:
        worker.stop()


def assert_same_numbers(
    a: Any, b: Any, tol: float = 1e-9, where: str = "result", ignore: tuple[str, ...] = ()
) -> None:
    """Equal structures; numbers within ``tol`` of each other, relative to their size where
    that exceeds 1 (a self-HSIC near 10⁶ carries float noise near 10⁻¹⁰ from the order of its
    sums); NaN equals NaN; keys in ``ignore`` skipped."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in set(a) - set(ignore):
            assert_same_numbers(a[k], b[k], tol, f"{where}.{k}", ignore)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_numbers(x, y, tol, f"{where}[{i}]", ignore)
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, (where, a, b)
        scale = max(1.0, abs(a), abs(b))
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol * scale, (where, a, b)
    else:
        assert a == b, (where, a, b)


def stored_result(services: Services, comparison_id: int) -> dict[str, Any]:
    """The result a comparison stored, read from the database (full float precision)."""
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        assert cmp is not None and cmp.result is not None
        return cmp.result
