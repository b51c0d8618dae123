"""The demo behind ``make run`` as jobs: queued once, trained one model at a time, then its
atlas; the home page tells where it is.

Trainings run through :class:`tests.app.study_tools.FakeTrainer` (the model as training
builds it, without the optimisation) and jobs are run one by one with
:func:`app.jobs.run.execute`, so the test sees every step of the demo.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.cli.demo import setup_demo
from app.http.main import create_app
from app.jobs.demo import seconds_left
from app.jobs.run import execute
from app.store.orm import Comparison, Job, JobState, Model
from app.store.services import Services
from app.store.settings import Settings
from models.training import ZOO
from tests.app.study_tools import FakeTrainer
from tests.servers import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]


def _banner(client: TestClient) -> str | None:
    found = re.search(r'id="demo-progress"[^>]*><a href="[^"]*">([^<]*)</a>', client.get("/").text)
    return found.group(1) if found else None


def test_demo_is_queued_once_and_the_home_page_follows_it(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app")
    fake = FakeTrainer()
    monkeypatch.setattr("app.jobs.train.train", fake)
    idle = settings.model_copy(update={"worker_threads": 0})
    job_id, queued = setup_demo(idle, tmp_path / "no-zoo", epochs=1)
    assert queued
    assert setup_demo(idle, tmp_path / "no-zoo", epochs=1) == (job_id, False)  # a second start
    services = Services(idle)
    try:
        with TestClient(create_app(idle)) as client:
            assert _banner(client) == "demo: training 1 of 6; then the atlas fills in"
            assert execute(services, "w:1:test") is not None  # the demo queues training 1
            # A demo run again while its training is queued (its worker died, the reaper put
            # it back) waits for that training instead of queuing a second one.
            with services.db.session() as s:
                s.execute(
                    update(Job)
                    .where(Job.id == job_id)
                    .values(status=JobState.QUEUED, worker_id=None)
                )
            assert execute(services, "w:1:test", job_id) is not None
            with services.db.session(readonly=True) as s:
                assert len(s.scalars(select(Job).where(Job.parent_id == job_id)).all()) == 1
            # Each training ends by handing the demo back, which queues the next.
            assert execute(services, "w:1:test") is not None
            banner = _banner(client) or ""
            assert re.fullmatch(
                r"demo: training 2 of 6, about \d+ min of training left; then the atlas fills in",
                banner,
            ), banner
            while len(fake.calls) < len(ZOO):
                assert execute(services, "w:1:test") is not None
            # One training at a time, in the zoo's order, each a child of the demo job.
            assert [(arch, seed) for arch, seed, _ in fake.calls] == [
                (arch, seed) for _, arch, seed in ZOO
            ]
            with services.db.session(readonly=True) as s:
                demo = s.get(Job, job_id)
                assert demo is not None and demo.status == JobState.SUCCEEDED
                children = s.scalars(select(Job).where(Job.parent_id == job_id)).all()
                assert [c.kind for c in children] == ["training"] * len(ZOO)
                names = set(s.scalars(select(Model.name)))
                cmp_id = demo.detail["comparison_id"]
                atlas = s.get(Comparison, cmp_id)
                assert atlas is not None
                assert [m.model_id for m in atlas.members] == sorted(s.scalars(select(Model.id)))
            assert names == {name for name, _, _ in ZOO}
            # What the terminal of `make run` shows of it (README.md): one line per model
            # trained, not each training's start and end or the demo's parking and resuming.
            said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
            assert [m for m in said if m.startswith("demo: model")] == [
                f"demo: model {k} of {len(ZOO)} trained ({ZOO[k - 1][0]})"
                for k in range(1, len(ZOO) + 1)
            ]
            assert not [m for m in said if re.match(r"job \d+ \(training\)|the demo waits", m)]
            assert _banner(client) == "demo: all models trained; the atlas is 0 % done"
            # Found, not queued again, once it has run.
            assert setup_demo(idle, tmp_path / "no-zoo", epochs=1) == (job_id, False)
            with services.db.session(readonly=True) as s:
                assert len(s.scalars(select(Job).where(Job.kind == "demo")).all()) == 1
    finally:
        services.close()


def test_serve_demo_answers_while_the_demo_trains(tmp_path: Path) -> None:
    """`make run` (``serve --demo``) serves before the zoo is trained: the URL is the first
    thing it prints, and the page tells the trainings' progress while they run."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CKA_")},
        "CKA_DATA_DIR": str(tmp_path / "data"),
        "CKA_DEVICE": "cpu",
        "CKA_LOG_LEVEL": "warning",
        "OMP_NUM_THREADS": "1",
    }
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--demo"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--zoo", str(tmp_path / "zoo")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(url, proc, log)
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        page = httpx.get(url, timeout=30).text
        banner = re.search(r'id="demo-progress"[^>]*><a href="/jobs">([^<]*)</a>', page)
        assert banner and re.match(r"demo: training [1-6] of 6", banner.group(1)), page[:2000]
        jobs = httpx.get(f"{url}/v1/jobs", params={"kind": "demo"}, timeout=30).json()
        assert any(j["kind"] == "demo" and j["status"] == "running" for j in jobs["items"]), jobs
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lines = log.read_text().splitlines()
    # After the store's one line (a new one here): the URL, then the demo.
    first = next(i for i, line in enumerate(lines) if "serving on" in line)
    assert lines[first] == f"cka-atlas: serving on {url}" and first <= 1, lines[:5]
    assert lines[first + 1].startswith("cka-atlas: demo queued (job 1)"), lines[:5]


def test_the_time_left_reckons_each_training_at_its_own_pace() -> None:
    """Issue 47: "about 1 min left" with 2 min to go. A cheap training done (10 s), a Mixer a
    quarter through after 20 s (80 s in all), then a gMLP and a Mixer: the Mixer at the running
    one's pace, the gMLP (none run yet) at the slowest pace known, not at the cheap one's."""
    finished = [("mlp_digits", 10.0)]
    running = ("mixer_digits", 20.0, 0.25)
    left = ["mixer_digits", "gmlp_digits", "mixer_digits"]
    assert seconds_left(finished, running, left) == pytest.approx(60 + 80 + 80)
    assert seconds_left([], None, left) is None  # no pace yet
    assert seconds_left([], ("mlp_digits", 5.0, 0.0), left) is None
    # the same architecture again: the slower of its runs
    assert seconds_left([("mlp_digits", 10.0), ("mlp_digits", 14.0)], None, ["mlp_digits"]) == 14.0
