"""The real server for the browser test: ``cka-atlas serve`` in a subprocess, with data.

The server runs exactly as a user starts it (the CLI, uvicorn, the in-process worker,
SQLite under a temporary data directory) on a free loopback port, with an API token
configured so that the page has to sign in before it may write. Its data is registered
through the REST API: randomly initialised checkpoints of three digits presets, an
uploaded dataset, one finished comparison, and one finished calibrated comparison (bootstrap
interval, permutation null and the random-init baseline) of two of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.e2e_tools import (
    CHROMIUM,
    CHROMIUM_ARGS,
    MODELS,
    RESULTS,
    ROOT,
    TOKEN,
    Server,
    bigger_digits,
    checkpoints,
    wait_done,
)
from tests.servers import free_port, wait_ready

# The calibrated comparison: few replicates and permutations, so that it is quick.
CALIBRATED: dict[str, Any] = {
    "batch_size": 150,
    "bootstrap": 20,
    "permutations": 50,
    "baselines": ["random_init", "seed_ceiling"],  # no sibling in the store: no ceiling
}


def _pair(srv: Server) -> dict[str, Any]:
    return {"model_ids": [srv.model_ids[m] for m in MODELS[:2]], "dataset_id": srv.digits_id}


@pytest.fixture(scope="session")
def results_dir() -> Path:
    """``test-results/e2e``: screenshots and the server log, kept for people to look at."""
    shutil.rmtree(RESULTS, ignore_errors=True)
    RESULTS.mkdir(parents=True)
    return RESULTS


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, results_dir: Path) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("e2e")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "CKA_DATA_DIR": str(tmp / "data"),
        "CKA_API_TOKENS": TOKEN,
        "CKA_DEVICE": "cpu",
        "CKA_HEARTBEAT_S": "0.2",
        "CKA_POLL_S": "0.2",
        "CKA_LOG_LEVEL": "warning",
        "OMP_NUM_THREADS": "1",
    }
    for name in ("CKA_DATABASE_URL", "CKA_BROKER_URL", "CKA_READ_REQUIRES_TOKEN"):
        env.pop(name, None)
    log = results_dir / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        stored = checkpoints(tmp / "zoo")
        big = bigger_digits(tmp)
        wait_ready(url, proc, log)
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        ) as api:
            srv = Server(url=url, api=api)
            for name, path in stored.items():
                with path.open("rb") as w, path.with_suffix(".json").open("rb") as s:
                    r = api.post("/v1/models", files={"weights": w, "sidecar": s})
                assert r.status_code == 201, r.text
                srv.model_ids[name] = r.json()["id"]
            datasets = api.get("/v1/datasets").json()["items"]
            srv.digits_id = next(d["id"] for d in datasets if d["name"] == "digits")
            with big.open("rb") as f:
                r = api.post("/v1/datasets", files={"file": (big.name, f)})
            assert r.status_code == 201, r.text
            srv.big_dataset_id = r.json()["id"]
            r = api.post(
                "/v1/comparisons",
                json={
                    "model_ids": list(srv.model_ids.values()),
                    "dataset_id": srv.digits_id,
                    "batch_size": 150,
                },
            )
            assert r.status_code == 202, r.text
            srv.finished_id = r.json()["id"]
            r = api.post("/v1/comparisons", json=CALIBRATED | _pair(srv))
            assert r.status_code == 202, r.text
            srv.calibrated_id = r.json()["id"]
            for cid in (srv.finished_id, srv.calibrated_id):
                done = wait_done(api, cid)
                assert done["status"] == "succeeded", done
            yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (never a downloaded browser)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
