"""What the browser test and its fixtures share: the server's settings and its data.

The fixtures that start the server and the browser are in ``conftest.py`` beside this file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "test-results" / "e2e"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "e2e-secret-token"
MODELS = ("mixer_digits", "sw_mlp_digits", "gmlp_digits")


@dataclass
class Server:
    """A running server and what the fixture registered in it."""

    url: str
    api: httpx.Client
    model_ids: dict[str, int] = field(default_factory=dict)
    digits_id: int = 0
    big_dataset_id: int = 0
    finished_id: int = 0
    calibrated_id: int = 0


def checkpoints(out: Path) -> dict[str, Path]:
    """Randomly initialised checkpoints of ``MODELS`` under ``out``."""
    import torch

    import models

    torch.manual_seed(0)
    return {n: models.save(models.create(n), out / f"{n}.safetensors") for n in MODELS}


def bigger_digits(out: Path) -> Path:
    """All 1,797 digits twice: a dataset long enough to watch a progress bar move."""
    from analysis import load_dataset

    data = load_dataset("digits", split="all")
    path = out / "digits-x2.npz"
    np.savez(path, x=np.concatenate([data.x, data.x]), y=np.concatenate([data.y, data.y]))
    return path


def wait_done(api: httpx.Client, comparison_id: int, timeout: float = 120) -> dict[str, Any]:
    """Poll a comparison until it ends; its final representation."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = api.get(f"/v1/comparisons/{comparison_id}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            return body
        time.sleep(0.2)
    raise AssertionError(f"comparison {comparison_id} did not finish")


def sign_in(page: Any, server: Server, next_path: str) -> None:
    """Sign in on the login page with the write token; it lands on ``next_path``."""
    page.goto(f"{server.url}/login?next={next_path}")
    page.fill('input[name="token"]', TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**{next_path}")
