"""Stopping a job holds whatever the job is doing (issue 48): a cancel answered 200 ends the job
cancelled even when its result comes after; the time limit ends a job that never reaches a
check; a server that stops leaves no job running. On SQLite and PostgreSQL.

The job here is a stand-in for a step that asks for no stop (the probe's measures stage): the
comparison's handler is replaced by :class:`Stage`, which enters, waits until the test lets it
go, and then commits its (empty) result, as a real handler ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.http.main import create_app
from app.jobs import embedded, run
from app.jobs.control import JobControl
from app.jobs.queue import CancelRequested, LostJob
from app.store.db import Database
from app.store.orm import Comparison, Job
from app.store.services import Services
from app.store.settings import Settings
from tests.helpers import digits_id, register, wait


class Stage:
    """A comparison's handler that holds its job inside one step that asks nothing."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.ended = threading.Event()
        self.outcome: object = None

    def __call__(self, services: Services, job: Job, control: JobControl) -> None:
        self.entered.set()
        self.go.wait(120)
        try:
            control.commit(lambda _s: None)
            self.outcome = "committed"
        except Exception as exc:
            self.outcome = exc
            raise
        finally:
            self.ended.set()


@pytest.fixture
def stage(monkeypatch: pytest.MonkeyPatch) -> Stage:
    held = Stage()
    monkeypatch.setitem(run.HANDLERS, "comparison", held)
    yield held
    held.go.set()  # never leave a worker thread waiting


def _queue(c: TestClient, zoo: dict[str, Path]) -> tuple[int, str]:
    body = {"model_ids": register(c, zoo, "mixer_digits"), "dataset_id": digits_id(c)}
    r = c.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"], r.headers["location"]


def _job(c: TestClient, services: Services, comparison_id: int) -> dict[str, Any]:
    with services.db.session(readonly=True) as s:
        job_id = s.get(Comparison, comparison_id).job_id  # type: ignore[union-attr]
    view: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
    return view


def _poll(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)
    return value


def test_a_cancel_answered_200_ends_cancelled_even_if_the_result_comes_after(
    settings: Settings, zoo: dict[str, Path], stage: Stage
) -> None:
    """The probe's knn_k 100 case: the cancel answered 200 while the job sat in a step that
    asks nothing, and the job then ended succeeded. The result's commit now finds the cancel
    and the job ends cancelled; nothing of its result is written."""
    with TestClient(create_app(settings)) as c:
        services: Services = c.app.state.services  # type: ignore[attr-defined]
        cid, url = _queue(c, zoo)
        assert stage.entered.wait(60)
        r = c.post(f"/v1/comparisons/{cid}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "running", r.text
        assert _job(c, services, cid)["cancel_requested"] is True
        stage.go.set()  # the step ends and its result comes, after the answered cancel
        done = wait(c, url)
        job = _job(c, services, cid)
    assert done["status"] == "cancelled" and done["error_code"] == "cancelled", done
    assert "cancelled by anonymous" in done["error"]
    assert isinstance(stage.outcome, CancelRequested)
    assert job["detail"]["history"][-1]["event"] == "stopped by its cancel at 0%", job


def test_the_time_limit_ends_a_job_that_never_reaches_a_check(
    settings: Settings, zoo: dict[str, Path], stage: Stage
) -> None:
    """CKA_JOB_TIMEOUT_S = 1 s and a step that asks nothing: the runner ends the job failed
    (job_timeout) while the step still runs; the result it produces afterwards is refused."""
    limited = settings.model_copy(update={"job_timeout_s": 1})
    with TestClient(create_app(limited)) as c:
        services: Services = c.app.state.services  # type: ignore[attr-defined]
        cid, url = _queue(c, zoo)
        assert stage.entered.wait(60)
        ended = _poll(
            "the job failed while its step still ran",
            lambda: (v := c.get(url).json())["status"] != "running" and v,
        )
        assert not stage.ended.is_set()  # it is still inside the step
        stage.go.set()
        assert stage.ended.wait(60)
        job = _job(c, services, cid)
    assert ended["status"] == "failed" and ended["error_code"] == "job_timeout", ended
    assert ended["error"].startswith("the job ran longer than CKA_JOB_TIMEOUT_S (1 s)")
    assert isinstance(stage.outcome, LostJob)  # its result came too late and was refused
    assert job["status"] == "failed"
    assert job["detail"]["history"][-1]["event"] == (
        "stopped by its runner: CKA_JOB_TIMEOUT_S passed"
    )


def test_a_stopping_server_leaves_no_job_running(
    settings: Settings, zoo: dict[str, Path], stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's SIGTERM left the row running (the worker waited 30 s for a step that asks
    nothing, then the process exited): the server's stop now gives the job back to the queue,
    said in its history, once the job has not reached a check within STOP_WAIT_S."""
    monkeypatch.setattr(embedded, "STOP_WAIT_S", 0.5)
    with TestClient(create_app(settings)) as c:
        cid, _ = _queue(c, zoo)
        assert stage.entered.wait(60)
    # the lifespan has ended: the worker was stopped while its step still ran
    assert not stage.ended.is_set()
    db = Database(str(settings.database_url))
    try:
        with db.session(readonly=True) as s:
            job = s.get(Job, s.get(Comparison, cid).job_id)  # type: ignore[union-attr]
            assert job is not None
            status, owner, history = job.status, job.worker_id, (job.detail or {})["history"]
        stage.go.set()
        assert stage.ended.wait(60)
        assert isinstance(stage.outcome, LostJob)  # what the stopped step produced is refused
    finally:
        db.dispose()
    assert status == "queued" and owner is None
    assert history[-1]["event"] == (
        "given back to the queue: the server stopped and the job did not reach a check within 0.5 s"
    )


def test_a_cancel_reaches_the_measures_between_pairs(
    settings: Settings, zoo: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real handler, in its measures stage (each pair of layers made slow): progress has
    passed the batches but reads below 1, and a cancel ends the job at the next pair, long
    before the stage's last pair, with nothing stored."""
    from dataclasses import replace

    from analysis.measures import registry
    from analysis.measures.protocol import Pair

    pairs: list[int] = []
    in_measures = threading.Event()
    real = registry.measure("mutual_knn")

    def slow_pair(pair: Pair) -> float:
        pairs.append(1)
        in_measures.set()
        time.sleep(0.25)
        return real.pair(pair)

    slow = tuple(replace(m, pair=slow_pair) if m is real else m for m in registry.REGISTERED)
    monkeypatch.setattr(registry, "REGISTERED", slow)
    with TestClient(create_app(settings)) as c:
        services: Services = c.app.state.services  # type: ignore[attr-defined]
        body = {
            "model_ids": register(c, zoo, "mixer_digits", "mlp_digits"),
            "dataset_id": digits_id(c),
            "measures": "mutual_knn",
        }
        r = c.post("/v1/comparisons", json=body)
        assert r.status_code == 202, r.text
        cid, url = r.json()["id"], r.headers["location"]
        assert in_measures.wait(120)
        # the batches are half the work (the measures the other half); the row follows within
        # a heartbeat
        running = _poll(
            "progress past the batches", lambda: (v := c.get(url).json())["progress"] >= 0.5 and v
        )
        assert running["status"] == "running" and running["progress"] < 1.0, running
        at_cancel = len(pairs)
        assert c.post(f"/v1/comparisons/{cid}/cancel").status_code == 200
        done = wait(c, url)
        job = _job(c, services, cid)
    assert done["status"] == "cancelled", done
    assert len(pairs) <= at_cancel + 2, (at_cancel, len(pairs))  # stopped at the next pair
    assert job["detail"]["history"][-1]["event"].startswith("stopped by its cancel at "), job
