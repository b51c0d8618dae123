"""The Celery path against a real Redis (the session's, see tests/servers.py) and a real worker
process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.http.main import create_app
from app.jobs.celery_process import celery_workers, worker_logs
from app.jobs.queue import claim
from app.store.orm import Comparison, Job, Model, Study, utcnow
from app.store.services import Services
from app.store.settings import Settings
from tests.app.fault_tools import CIFAR, upload_dataset
from tests.app.study_tools import TINY
from tests.deadline import Deadline
from tests.helpers import (
    assert_same_numbers,
    digits_id,
    make_settings,
    register,
    stored_result,
    wait,
)

# Celery workers run beside PostgreSQL: the GPU host's stack (docs/deploy.md). A laptop's SQLite
# store has the in-process worker instead, whose tests run on both databases.
pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


@pytest.fixture
def broker_settings(settings: Settings, redis_url: str) -> Iterator[Settings]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()
    except redis.RedisError as exc:  # fail, never skip: the Celery pass is required
        pytest.fail(f"Redis at {redis_url} is unreachable ({exc}); the Celery tests need it")
    queue = f"cka-test-{uuid.uuid4().hex[:10]}"
    yield settings.model_copy(update={"broker_url": redis_url, "celery_queue": queue})
    client.delete(queue, f"{queue}\x06\x161", f"{queue}\x06\x162")
    client.close()


def _killable(settings: Settings) -> Settings:
    """Workers that re-queue a killed worker's job after 4 s without heartbeat."""
    return settings.model_copy(update={"stale_after_s": 4})


def test_celery_worker_runs_queued_and_stale_jobs(
    broker_settings: Settings, zoo: dict[str, Path], tmp_path: Path
) -> None:
    with TestClient(create_app(broker_settings)) as client:
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        ids = register(client, zoo, "mixer_digits", "gmlp_digits", "mlp_digits")
        body = {"dataset_id": digits_id(client), "batch_size": 150}
        queued = client.post("/v1/comparisons", json={"model_ids": ids[:2], **body})
        stale = client.post("/v1/comparisons", json={"model_ids": ids[1:], **body})
        assert queued.status_code == stale.status_code == 202
        # The second job's worker "died": running, with a heartbeat long past.
        with services.db.session() as s:
            stale_job = s.get(Comparison, stale.json()["id"]).job_id  # type: ignore[union-attr]
        dead = claim(services.db, "celery:dead", stale_job)
        assert dead is not None
        with services.db.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == dead.id)
                .values(heartbeat_at=utcnow() - timedelta(hours=1))
            )
        worker_settings = broker_settings.model_copy(update={"stale_after_s": 30})
        with celery_workers(worker_settings, tmp_path, [None]) as procs:
            first = wait(client, queued.headers["location"], timeout=180, alive=procs["worker"])
            second = wait(client, stale.headers["location"], timeout=180, alive=procs["worker"])
        log = worker_logs(tmp_path, procs)["worker"]
        assert first["status"] == "succeeded", (first, log)
        assert second["status"] == "succeeded", (second, log)
        assert first["provenance"]["worker"].startswith("celery:")
        with services.db.session() as s:
            assert s.get(Job, dead.id).attempts == 2  # type: ignore[union-attr]


def test_celery_workers_name_a_worker_that_exits_before_consuming(
    broker_settings: Settings, tmp_path: Path
) -> None:
    """celery_workers hands workers over only once they consume the queue: one whose settings
    its own process refuses (a heartbeat must be positive) exits, and is named with its log."""
    broken = broker_settings.model_copy(
        update={"heartbeat_s": -1.0}
    )  # model_copy validates nothing
    with (
        pytest.raises(RuntimeError, match=r"^worker w1 exited with [1-9]"),
        celery_workers(broken, tmp_path, ["w1"]),
    ):
        pass


def _shards_of(client: TestClient, services: Services, comparison_id: int) -> list[dict[str, Any]]:
    with services.db.session(readonly=True) as s:
        parent = s.get(Comparison, comparison_id).job_id  # type: ignore[union-attr]
    page = client.get("/v1/jobs", params={"kind": "shard", "parent_id": parent}).json()
    return sorted(page["items"], key=lambda j: j["shard"])


def _node(worker_id: str) -> str:
    return worker_id.split(":")[0]  # "celery-w1:host:pid:uuid" -> "celery-w1"


def _amid_on_w1(job: dict[str, Any]) -> bool:
    """A job (as /v1/jobs lists it) that worker w1 is running, neither at its start nor end."""
    mine = job["status"] == "running" and _node(job["worker"]) == "celery-w1"
    return mine and 0 < job["progress"] < 1


def _kill_w1_amid(
    find: Callable[[], dict[str, Any] | None],
    workers: dict[str, subprocess.Popen[bytes]],
    what: str,
    timeout: float,
    jobs: Callable[[], list[dict[str, Any]]],
    log_dir: Path,
) -> dict[str, Any]:
    """Poll ``find`` until it gives a job w1 runs, then SIGKILL w1 mid-way; that job. Past
    ``timeout``, fail saying what was waited for: the ``jobs`` as they stood and the workers'
    last log lines."""
    deadline = time.monotonic() + timeout
    victim = None
    while victim is None and time.monotonic() < deadline:
        victim = find()
        time.sleep(0.02)
    if victim is None:
        raise AssertionError(
            f"waited {timeout:.0f} s for w1 to be in the middle of {what}; the jobs then: "
            f"{_states(jobs())}\n{_tails(log_dir, workers)}"
        )
    os.killpg(workers["w1"].pid, signal.SIGKILL)
    workers["w1"].wait(timeout=30)
    return victim


def _states(jobs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each job as (id, status, progress, worker node): what a failed wait reports."""
    return [
        (j["id"], j["status"], round(j["progress"], 2), _node(j["worker"] or "-")) for j in jobs
    ]


def _tails(log_dir: Path, workers: dict[str, subprocess.Popen[bytes]]) -> str:
    logs = worker_logs(log_dir, workers)
    return "\n".join(f"--- {name} (last lines):\n{text[-1500:]}" for name, text in logs.items())


def _finished(
    client: TestClient,
    url: str,
    deadline: Deadline,
    workers: dict[str, subprocess.Popen[bytes]],
    log_dir: Path,
    jobs: Callable[[], list[dict[str, Any]]],
    alive: subprocess.Popen[bytes] | None = None,
) -> dict[str, Any]:
    """:func:`tests.helpers.wait` for ``url`` within the test's deadline; past it, what was
    waited for: the job, its children and the workers' last log lines."""
    try:
        return wait(client, url, timeout=deadline.left(), alive=alive)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; its jobs: {_states(jobs())}\n{_tails(log_dir, workers)}"
        ) from None


def _reference(zoo: dict[str, Path], data_path: Path, **options: Any) -> dict[str, Any]:
    """What ``analysis.compare`` gives in this process, in one piece, with no Gram store, on
    one thread like the workers (float32 Grams depend on how a product is split)."""
    import torch

    import analysis
    import models

    nets = {name: models.load(path)[0].eval() for name, path in zoo.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = analysis.load_dataset(str(data_path))
        return analysis.compare(nets, data, device="cpu", **options).to_dict()
    finally:
        torch.set_num_threads(threads)


def test_two_workers_share_a_sharded_comparison_and_survive_a_kill(
    broker_settings: Settings,
    cifar_zoo: dict[str, Path],
    slow_data: Path,
    tmp_path: Path,
    deadline: Deadline,
) -> None:
    """Two ``cka-atlas worker --name`` processes; every run computes from scratch (each has
    its own batch size, so none reuses another's stored Grams). Every wait takes its bound
    from the test's deadline (inside pytest-timeout's) and says what it waited for."""
    settings = broker_settings
    calibration = {"bootstrap": 20, "permutations": 40}
    with TestClient(create_app(settings)) as client:
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        ids = register(client, cifar_zoo, *CIFAR)
        ds = upload_dataset(client, slow_data)  # 600 random 32x32 images
        body = {"model_ids": ids, "dataset_id": ds, **calibration}
        ready = deadline.left(at_most=180)
        with celery_workers(_killable(settings), tmp_path, ("w1", "w2"), ready) as workers:
            two = client.post("/v1/comparisons", json=body | {"batch_size": 25, "shards": 2})
            cid = two.json()["id"]
            done = _finished(
                client,
                two.headers["location"],
                deadline,
                workers,
                tmp_path,
                lambda: _shards_of(client, services, cid),
            )
            assert done["status"] == "succeeded", done
            assert {_node(s["worker"]) for s in done["diagnostics"]["shards"]} == {
                "celery-w1",
                "celery-w2",
            }

            # four shards of 6 batches; w1 is SIGKILLed in the middle of one of them: w2
            # re-runs it, ends the last shard and combines them
            four = client.post("/v1/comparisons", json=body | {"batch_size": 20, "shards": 4})
            cid = four.json()["id"]

            def shards() -> list[dict[str, Any]]:
                return _shards_of(client, services, cid)

            victim = _kill_w1_amid(
                lambda: next(filter(_amid_on_w1, shards()), None),
                workers,
                "a shard",
                deadline.left(),
                shards,
                tmp_path,
            )
            killed = _finished(
                client, four.headers["location"], deadline, workers, tmp_path, shards, workers["w2"]
            )
        logs = worker_logs(tmp_path, workers)
        assert killed["status"] == "succeeded", (killed, logs["w2"][-3000:])
        redone = _shards_of(client, services, cid)[victim["shard"]]
        assert redone["attempts"] == 2 and _node(redone["detail"]["worker"]) == "celery-w2"
        assert [s["shard"] for s in killed["diagnostics"]["shards"]] == [0, 1, 2, 3]
        with services.db.session(readonly=True) as s:  # one result: the job succeeded once
            job = s.get(Job, s.get(Comparison, cid).job_id)  # type: ignore[union-attr]
            assert job is not None and job.status == "succeeded" and job.attempts == 1
        for response, batch in ((two, 25), (four, 20)):
            layers = done["params"]["resolved_layers"]  # what the service resolved the defaults to
            expected = _reference(
                cifar_zoo, slow_data, batch_size=batch, layers=layers, **calibration
            )
            stored = stored_result(services, response.json()["id"])
            # the counters differ: no store in-process, and the re-run shard read the Grams
            # its killed predecessor had stored instead of running the models again
            assert_same_numbers(expected, stored, ignore=("gram_cache", "forward_passes"))


def test_a_worker_told_to_stop_hands_its_job_back_at_the_next_batch(
    broker_settings: Settings,
    cifar_zoo: dict[str, Path],
    slow_data: Path,
    tmp_path: Path,
    deadline: Deadline,
) -> None:
    """SIGTERM (Celery's warm shutdown) to a worker in the middle of a comparison of 24
    batches: the worker gives the job back at its next batch and exits, the job is queued
    again (its history says why), and another worker runs it to the end. Before, the worker
    finished the job first (the probe: 7 s later) and only then exited."""
    settings = broker_settings
    with TestClient(create_app(settings)) as client:
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        ids = register(client, cifar_zoo, *CIFAR)
        ds = upload_dataset(client, slow_data)  # 600 random 32x32 images, 24 batches of 25
        body = {"model_ids": ids, "dataset_id": ds, "batch_size": 25}
        ready = deadline.left(at_most=180)
        (tmp_path / "first").mkdir()
        (tmp_path / "second").mkdir()
        with celery_workers(settings, tmp_path / "first", ("w1",), ready) as workers:
            r = client.post("/v1/comparisons", json=body)
            assert r.status_code == 202, r.text
            with services.db.session(readonly=True) as s:
                job_id = s.get(Comparison, r.json()["id"]).job_id  # type: ignore[union-attr]

            def job() -> dict[str, Any]:
                view: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
                return view

            until = time.monotonic() + deadline.left()
            while not (job()["status"] == "running" and 0 < job()["progress"] < 0.5):
                assert time.monotonic() < until, f"w1 never got a batch into the job: {job()}"
                assert workers["w1"].poll() is None, worker_logs(tmp_path / "first", workers)
                time.sleep(0.02)
            os.killpg(workers["w1"].pid, signal.SIGTERM)
            code = workers["w1"].wait(timeout=deadline.left(at_most=120))
            stopped = job()
        log = worker_logs(tmp_path / "first", workers)["w1"]
        assert code == 0, log[-3000:]
        assert stopped["status"] == "queued" and stopped["worker"] is None, (stopped, log[-3000:])
        event = stopped["detail"]["history"][-1]["event"]
        assert event.startswith("given back to the queue: its worker was stopped at "), event
        with celery_workers(settings, tmp_path / "second", ("w2",), deadline.left()) as again:
            done = wait(client, r.headers["location"], deadline.left(), alive=again["w2"])
        assert done["status"] == "succeeded" and done["attempts"] == 2, done


def _one_worker_sha256s(tmp_path: Path) -> dict[str, str]:
    """Every training of TINY run one after another in this process, on one thread as the
    workers are: the weights' sha256 by training key."""
    import hashlib

    import torch

    from analysis import studies, training_data
    from models.training import train

    plan = studies.plan(TINY, quick=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for k, t in enumerate(plan.trainings):
            data = training_data(t.dataset)
            path = train(
                t.arch, data, out_dir=tmp_path / f"solo-{k}", name="model", **t.train_kwargs()
            )
            out[t.key] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return out
    finally:
        torch.set_num_threads(threads)


def _one_worker_summary(tmp_path: Path) -> dict[str, Any]:
    """TINY run as a study by the embedded worker (one thread, like each Celery worker) of
    an app of its own, without a broker, on a store of its own: its summary."""
    import torch

    solo = make_settings(f"sqlite:///{tmp_path / 'solo.db'}", tmp_path / "solo")
    solo = solo.model_copy(update={"cpu_threads": 1})  # the worker sets it as it starts
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with TestClient(create_app(solo)) as client:
            r = client.post("/v1/studies", json={"spec": TINY, "quick": True})
            done = wait(client, r.headers["location"], timeout=600)
            assert done["status"] == "succeeded", done
            services: Services = client.app.state.services  # type: ignore[attr-defined]
            with services.db.session(readonly=True) as s:
                row = s.get(Study, r.json()["id"])
                assert row is not None and row.summary is not None
                return dict(row.summary)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_worker_tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Any]:
    """TINY on one worker, once for every database the study test runs on (neither depends
    on it): the checkpoints' sha256 by training key, and the study's summary."""
    root = tmp_path_factory.mktemp("one-worker")
    return _one_worker_sha256s(root), _one_worker_summary(root)


def test_two_workers_share_a_study_and_survive_a_kill(
    broker_settings: Settings,
    tmp_path: Path,
    one_worker_tiny: tuple[dict[str, str], Any],
    deadline: Deadline,
) -> None:
    """Two ``cka-atlas worker --name`` processes run a study's trainings; w1 is SIGKILLed in
    the middle of one after it finished another: w2 re-runs it and the study ends once, with
    the checkpoints and the summary one worker gives. Each training stored its model's Grams
    for the atlas, which runs no model. Every wait takes its bound from the test's deadline,
    which counts the module's reference run too (inside pytest-timeout's 300 s), and says
    what it waited for: the trainings as they stood and the workers' last log lines."""
    settings = broker_settings
    with TestClient(create_app(settings)) as client:
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        ready = deadline.left(at_most=180)
        with celery_workers(_killable(settings), tmp_path, ("w1", "w2"), ready) as workers:
            r = client.post("/v1/studies", json={"spec": TINY, "quick": True})
            assert r.status_code == 202, r.text
            study = r.json()
            with services.db.session(readonly=True) as s:
                job_id = s.get(Study, study["id"]).job_id  # type: ignore[union-attr]
            children = {"parent_id": job_id, "kind": "training", "limit": 50}

            def listed() -> list[dict[str, Any]]:
                page: dict[str, Any] = client.get("/v1/jobs", params=children).json()
                return list(page["items"])

            def second_on_w1() -> dict[str, Any] | None:
                """A training w1 runs after it finished another."""
                items = listed()
                w1_done = [
                    j
                    for j in items
                    if j["status"] == "succeeded" and _node(j["detail"]["worker"]) == "celery-w1"
                ]
                return next(filter(_amid_on_w1, items), None) if w1_done else None

            victim = _kill_w1_amid(
                second_on_w1,
                workers,
                "its second training",
                deadline.left(),
                listed,
                tmp_path,
            )
            done = _finished(
                client,
                r.headers["location"],
                deadline,
                workers,
                tmp_path,
                listed,
                workers["w2"],
            )
        logs = worker_logs(tmp_path, workers)
        assert done["status"] == "succeeded", (done, logs["w2"][-3000:])
        trainings = client.get("/v1/jobs", params=children).json()["items"]
        assert len(trainings) == 6 and all(j["status"] == "succeeded" for j in trainings)
        assert {_node(j["detail"]["worker"]) for j in trainings} == {"celery-w1", "celery-w2"}
        assert all(j["detail"]["seconds"] > 0 for j in trainings)
        redone = next(j for j in trainings if j["id"] == victim["id"])
        assert redone["attempts"] == 2 and _node(redone["detail"]["worker"]) == "celery-w2"
        # its history says what happened to its first run
        assert [e["event"] for e in redone["detail"]["history"]] == [
            "re-queued by the reaper: no heartbeat for 4 s"
        ]
        with services.db.session(readonly=True) as s:  # one result: the study succeeded once
            row = s.get(Study, study["id"])
            assert row is not None and row.job.status == "succeeded" and row.summary is not None
            models = {m.training_key: s.get(Model, m.model_id) for m in row.members}
            shas = {key: m.sha256 for key, m in models.items() if m is not None}
            assert s.query(Model).count() == 6  # the killed training registered nothing twice
            summary = dict(row.summary)
            atlas = s.get(Comparison, row.comparison_id)
            assert atlas is not None and atlas.diagnostics is not None
            batches = -(-450 // 150)  # digits' test images in batches of 150
            assert set(atlas.diagnostics["forward_passes"].values()) == {0}
            assert atlas.diagnostics["gram_cache"]["hits"] == 6 * batches
            assert atlas.diagnostics["gram_cache"]["misses"] == 0
        page = client.get(f"/studies/{study['id']}").text
        assert "celery-w1" in page and "celery-w2" in page  # each training's worker
    expected_shas, expected = one_worker_tiny
    assert shas == expected_shas
    # the same numbers to 1e-12; the ids are each store's own
    assert_same_numbers(expected, summary, tol=1e-12, ignore=("model_ids", "comparison_id"))
