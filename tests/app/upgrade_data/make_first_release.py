"""Make ``first_release.sql``: a store populated by the first release (schema 0001).

Not a test: it runs the code of 2026-11-22 (commit 1641ab3), not this checkout's. Run it as

    git archive 1641ab3 | tar -x -C /tmp/release1
    PYTHONPATH=/tmp/release1 .venv/bin/python tests/app/upgrade_data/make_first_release.py \\
        /tmp/release1-store tests/app/upgrade_data/first_release.sql

It uses only that release's REST API, as a user of it would: uploads two randomly initialised
checkpoints, trains a third model for one epoch, runs one comparison of the three over digits,
and writes the SQLite database as SQL text (the checkpoints stay in the store directory).
"""

from __future__ import annotations

import importlib
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import torch
from fastapi.testclient import TestClient

import models

UPLOADED = ("mixer_digits", "rp_mixer_digits")


def _wait(client: TestClient, url: str) -> dict[str, Any]:
    for _ in range(3000):
        body: dict[str, Any] = client.get(url).json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            assert body["status"] == "succeeded", body
            return body
        time.sleep(0.1)
    raise TimeoutError(url)


def main(store: Path, out: Path) -> None:
    settings_mod = importlib.import_module("app.settings")  # the first release's layout
    main_mod = importlib.import_module("app.main")
    store.mkdir(parents=True, exist_ok=False)
    settings = settings_mod.Settings(
        database_url=f"sqlite:///{store / 'cka.db'}",
        data_dir=store / "data",
        worker_threads=1,
        poll_s=0.1,
        device="cpu",
        api_tokens="",
    )
    torch.manual_seed(0)
    zoo = store / "zoo"
    paths = [models.save(models.create(n), zoo / f"{n}.safetensors") for n in UPLOADED]
    with TestClient(main_mod.create_app(settings)) as c:
        ds = c.get("/v1/datasets").json()["items"][0]["id"]
        ids = []
        for p in paths:
            files = {
                "weights": (p.name, p.read_bytes()),
                "sidecar": (p.with_suffix(".json").name, p.with_suffix(".json").read_bytes()),
            }
            r = c.post("/v1/models", files=files)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        body = {"arch": "mixer_digits", "dataset_id": ds, "epochs": 1, "seed": 1}
        r = c.post("/v1/trainings", json=body)
        ids.append(_wait(c, f"/v1/trainings/{r.json()['id']}")["model_id"])
        r = c.post("/v1/comparisons", json={"model_ids": ids, "dataset_id": ds, "batch_size": 150})
        _wait(c, f"/v1/comparisons/{r.json()['id']}")
    with sqlite3.connect(store / "cka.db") as db:
        out.write_text("\n".join(db.iterdump()) + "\n", encoding="utf-8")
    print(json.dumps({"models": ids, "sql": str(out)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
