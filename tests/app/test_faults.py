"""Faults, each against real processes and services (issue 6, part 2).

1. a Celery worker SIGKILLed mid-comparison: the job is re-queued and finishes once;
2. ``cka-atlas serve`` stopped (SIGTERM) and killed (SIGKILL) while jobs run: all finish;
3. PostgreSQL restarted during a job: the job rides it out and writes its result once (the
   test's own throwaway server, never the one the rest of the suite uses);
4. the artifact store read-only, and full: the job fails with a sentence, nothing half
   written, and succeeds once the fault is cleared;
5. 20 concurrent identical requests: one job, held by the database's unique constraint;
6. 10 plain and 10 forced deletes of one model in use, at once: 204, 404 or 409, never 500;
7. the broker restarted without persistence, with a job waiting in it and one posted while it
   was down: a worker's reaper publishes both again, and each runs once (issue 36).
"""

from __future__ import annotations

import io
import logging
import re
import signal
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load_file
from sqlalchemy import func, inspect, select
from sqlalchemy.exc import IntegrityError

from app.http.main import create_app
from app.store.db import Database
from app.store.orm import Comparison, Job
from app.store.services import Services
from app.store.settings import Settings
from tests.app.fault_tools import (
    CIFAR,
    Proc,
    assert_consistent,
    chmod_dirs,
    fill,
    job_of,
    poll,
    remount,
    service_env,
    try_mount_tmpfs,
    umount,
    unprivileged_worker,
    upload_dataset,
    wait_serving,
)
from tests.helpers import FINAL, digits_id, make_settings, register, run_until_final, wait
from tests.servers import PgServer, RedisServer, free_port


def submit_slow(client: TestClient, zoo: dict[str, Path], data: Path) -> tuple[Database, int]:
    """The cifar models over the slow dataset in batches of 25: a job of many batches."""
    db: Database = client.app.state.services.db  # type: ignore[attr-defined]
    ids = register(client, zoo, *CIFAR)
    body = {"model_ids": ids, "dataset_id": upload_dataset(client, data), "batch_size": 25}
    r = client.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    return db, int(r.json()["id"])


def running(db: Database, comparison_id: int) -> Job | None:
    """The comparison's job once it runs and has made progress; fails if it already ended."""
    job = job_of(db, comparison_id)
    if job.status in FINAL:
        raise AssertionError(f"job {job.id} ended ({job.status}: {job.error}) before the fault")
    return job if job.status == "running" and job.progress > 0 else None


# 1. Celery worker killed ------------------------------------------------------------------


@pytest.fixture
def broker(settings: Settings, redis_url: str) -> Iterator[Settings]:
    """The session's Redis (only a worker is killed here, never the server)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()
    except redis.RedisError as exc:  # fail, never skip
        pytest.fail(f"Redis at {redis_url} is unreachable ({exc}); the Celery fault test needs it")
    queue = f"cka-faults-{uuid.uuid4().hex[:10]}"
    yield settings.model_copy(update={"broker_url": redis_url, "celery_queue": queue})
    client.delete(queue, f"{queue}\x06\x161", f"{queue}\x06\x162")
    for tag, message in client.hgetall("unacked").items():  # the killed worker's delivery
        if queue.encode() in message:
            client.hdel("unacked", tag)
            client.zrem("unacked_index", tag)
    client.close()


# Celery workers run beside PostgreSQL, the GPU host's stack (docs/deploy.md); SQLite has the
# in-process worker, whose faults run on both databases.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_celery_worker_sigkilled_midway_job_is_requeued_and_finishes_once(
    broker: Settings, cifar_zoo: dict[str, Path], slow_data: Path, tmp_path: Path
) -> None:
    env = service_env(broker.resolved_database_url, broker.data_dir)
    env |= {"CKA_BROKER_URL": str(broker.broker_url), "CKA_CELERY_QUEUE": broker.celery_queue}
    with TestClient(create_app(broker)) as client:  # with a broker the API only enqueues
        db, cid = submit_slow(client, cifar_zoo, slow_data)
        # Two workers start together (their start-up is most of this test's time); the one
        # that takes the job is SIGKILLed, the other must re-queue and finish it.
        workers = [Proc(["worker"], env, tmp_path / f"worker-{i}.log") for i in (1, 2)]
        try:
            job = poll(lambda: running(db, cid), 90, "a worker started the job", tuple(workers))
            pid = int(str(job.worker_id).split(":")[2])  # celery:<host>:<pid>:<nonce>
            victim = next(w for w in workers if w.popen.pid == pid)
            survivor = next(w for w in workers if w is not victim)
            victim.stop(signal.SIGKILL)
            assert job_of(db, cid).status == "running", "the kill did not land midway"
            done = wait(client, f"/v1/comparisons/{cid}", timeout=90, alive=survivor.popen)
        finally:
            for w in workers:
                w.stop(timeout=5)
        assert done["status"] == "succeeded", (done, survivor.output())
        assert done["attempts"] == 2 and done["provenance"]["worker"] != job.worker_id
        assert "re-queued stale jobs" in survivor.output()
        counts = assert_consistent(db)
        assert counts == {"comparisons": 1, "succeeded": 1, "failed": 0, "unfinished": 0}
        # The kill left no half-written Gram under a final name (the re-run read them back).
        stored = list((broker.data_dir / "grams").rglob("*.safetensors"))
        assert stored and all(load_file(p)["grams"].size for p in stored)


# 2. The API (embedded worker) restarted ----------------------------------------------------


def test_api_restarted_while_jobs_run_loses_and_duplicates_nothing(
    db_url: str, cifar_zoo: dict[str, Path], slow_data: Path, tmp_path: Path
) -> None:
    env = service_env(db_url, tmp_path / "data", CKA_WORKER_THREADS="1")
    db = Database(db_url)
    servers: list[Proc] = []
    clients: list[httpx.Client] = []

    def serve() -> httpx.Client:
        port = free_port()
        proc = Proc(["serve", "--port", str(port)], env, tmp_path / f"serve-{len(servers)}.log")
        servers.append(proc)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        clients.append(http)

        wait_serving(http, proc)
        return http

    try:
        http = serve()
        ids = register(http, cifar_zoo, *CIFAR)  # type: ignore[arg-type]
        ds = upload_dataset(http, slow_data)
        cids = []
        for models, batch in ((ids, 25), (ids[:1], 25), (ids[1:], 50)):
            r = http.post(
                "/v1/comparisons", json={"model_ids": models, "dataset_id": ds, "batch_size": batch}
            )
            assert r.status_code == 202, r.text
            cids.append(r.json()["id"])

        # SIGTERM: the server stops its worker, which gives the running job back at once.
        poll(lambda: running(db, cids[0]), 60, "the first job started", (servers[-1],))
        assert servers[-1].stop(signal.SIGTERM) in (0, -signal.SIGTERM)  # uvicorn re-raises it
        assert "put back in the queue" in servers[-1].output(), servers[-1].output()
        assert job_of(db, cids[0]).status == "queued", servers[-1].output()

        # SIGKILL: the job is left running; the next server re-queues it once it is stale.
        http = serve()
        busy = poll(
            lambda: next((c for c in cids if running(db, c)), None),
            60,
            "a job started after the restart",
            (servers[-1],),
        )
        servers[-1].stop(signal.SIGKILL)
        assert job_of(db, busy).status == "running", "the kill did not land midway"

        http = serve()
        poll(
            lambda: all(job_of(db, c).status in FINAL for c in cids),
            120,
            "every job finished after the second restart",
            (servers[-1],),
        )
        jobs = {c: job_of(db, c) for c in cids}
        assert all(j.status == "succeeded" for j in jobs.values()), {
            c: (j.status, j.error) for c, j in jobs.items()
        }
        assert jobs[busy].attempts >= 2 and jobs[cids[0]].attempts >= 2
        assert assert_consistent(db)["succeeded"] == 3
    finally:
        for http in clients:
            http.close()
        for proc in servers:
            proc.stop(signal.SIGKILL)
        db.dispose()


# 3. PostgreSQL restarted ------------------------------------------------------------------


def test_postgres_restart_during_a_job_is_ridden_out(
    own_pg: PgServer,
    cifar_zoo: dict[str, Path],
    slow_data: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app")
    settings = make_settings(own_pg.url, tmp_path / "data")
    with TestClient(create_app(settings)) as client:
        db, cid = submit_slow(client, cifar_zoo, slow_data)
        job_id = poll(lambda: running(db, cid), 60, "the job started").id
        retrying = f"writing the result of job {job_id} failed"
        own_pg.stop()
        # The job keeps computing while its heartbeats fail, then retries its final write.
        poll(
            lambda: retrying in caplog.text or f"job {job_id} succeeded" in caplog.text,
            60,
            "the job finished computing while PostgreSQL was down",
        )
        assert retrying in caplog.text, "the job ended before PostgreSQL went down"
        own_pg.start()  # returns once the server accepts connections
        done = wait(client, f"/v1/comparisons/{cid}", timeout=60)
        assert done["status"] == "succeeded", (done, caplog.text[-3000:])
        assert done["attempts"] == 1  # ridden out, not re-queued and run again
        assert "heartbeat of job" in caplog.text
        counts = assert_consistent(db)
        assert counts == {"comparisons": 1, "succeeded": 1, "failed": 0, "unfinished": 0}


# 4. The artifact store read-only, and full ------------------------------------------------

ERRORS = {  # the mounted store's errno, or the unprivileged worker's (EACCES, EFBIG)
    "read-only": r"the artifact store at \S+ is not writable \((read-only file sys|permission)",
    "full": r"(no space left on the artifact store at|the artifact store at \S+ refused to grow)",
}


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_artifact_store_read_only_or_full_fails_the_job_with_a_sentence(
    fault: str, db_url: str, zoo: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    mounted = try_mount_tmpfs(store)  # else: a worker process that cannot write or grow files
    try:
        settings = make_settings(db_url, store, worker_threads=0)
        with TestClient(create_app(settings)) as client:
            services: Services = client.app.state.services  # type: ignore[attr-defined]
            ids = register(client, zoo, "mixer_digits", "gmlp_digits")
            # One batch of 450: its stored Grams (5.7 MB for the Mixer) exceed FSIZE_LIMIT.
            body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 450}
            r = client.post("/v1/comparisons", json=body)
            assert r.status_code == 202, r.text
            if mounted:
                filler = fill(store) if fault == "full" else None
                if fault == "read-only":
                    remount(store, "ro")
                # an upload into the faulty store is refused with the same sentence, not a 500
                up = client.post("/v1/datasets", files={"file": ("x.npz", npz_bytes(64))})
                assert up.status_code == (507 if fault == "full" else 503), up.text
                assert up.json()["code"] == "storage_error", up.text
                failed = run_until_final(client, services, r.headers["location"], timeout=60)
                if filler is not None:
                    filler.unlink()
                else:
                    remount(store, "rw")
            else:
                chmod_dirs(store, 0o555 if fault == "read-only" else 0o755)
                env = service_env(db_url, store)
                proc = unprivileged_worker(fault, env, tmp_path / "worker.log")
                try:
                    failed = wait(client, r.headers["location"], timeout=60, alive=proc.popen)
                finally:
                    proc.stop()
                    chmod_dirs(store, 0o755)
            assert failed["status"] == "failed", failed
            assert failed["error_code"] == "storage_error", failed
            error = failed["error"]
            assert re.match(ERRORS[fault], error) and "\n" not in error, error
            assert "Traceback" not in error and "Errno" not in error, error
            assert not [p for p in store.rglob("*") if p.suffix in (".tmp", ".part")]
            assert assert_consistent(services.db) == {
                "comparisons": 1,
                "succeeded": 0,
                "failed": 1,
                "unfinished": 0,
            }
            # The fault cleared, the same request runs again and succeeds.
            again = client.post("/v1/comparisons", json=body)
            assert again.status_code == 202 and again.json()["id"] != failed["id"], again.text
            done = run_until_final(client, services, again.headers["location"], timeout=60)
            assert done["status"] == "succeeded", done
            assert assert_consistent(services.db) == {
                "comparisons": 2,
                "succeeded": 1,
                "failed": 1,
                "unfinished": 0,
            }
    finally:
        if mounted:
            umount(store)


def npz_bytes(n: int) -> bytes:
    """A valid .npz of ``n`` random 8×8 grey images, large enough to need a data block."""
    buf = io.BytesIO()
    x = np.random.default_rng(0).random((n, 1, 8, 8), dtype=np.float32)
    np.savez(buf, x=x)
    return buf.getvalue()


# 5. Twenty concurrent identical requests --------------------------------------------------


def test_twenty_concurrent_identical_requests_make_one_job(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    """Fired together from 20 threads; the unique request_hash, not Python, decides."""
    client = idle_client
    ids = register(client, zoo, "mixer_digits", "sw_mlp_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    start = threading.Barrier(20)

    def fire(_: int) -> Any:
        start.wait(timeout=30)  # all 20 requests leave at once
        return client.post("/v1/comparisons", json=body)

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(fire, range(20)))
    assert all(r.status_code in (200, 202) for r in responses), [r.text for r in responses]
    assert len({r.headers["location"] for r in responses}) == 1
    assert sum(r.status_code == 202 for r in responses) == 1
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    with services.db.session() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
        assert s.scalar(select(func.count()).select_from(Comparison)) == 1
    # The guarantee lives in the schema: a second row with the same hash is refused.
    unique = inspect(services.db.engine).get_unique_constraints("comparisons")
    indexes = inspect(services.db.engine).get_indexes("comparisons")
    assert any(c["column_names"] == ["request_hash"] for c in unique) or any(
        i["unique"] and i["column_names"] == ["request_hash"] for i in indexes
    )
    with pytest.raises(IntegrityError), services.db.session() as s:
        first = s.scalars(select(Comparison)).one()
        job = Job(kind="comparison", status="queued", progress=0.0, attempts=0)
        s.add(job)
        s.flush()
        s.add(
            Comparison(
                request_hash=first.request_hash,
                params=first.params,
                dataset_id=first.dataset_id,
                job_id=job.id,
                kernel=first.kernel,
            )
        )
        s.flush()


# 6. Concurrent deletes of what a queued comparison uses -----------------------------------


def test_concurrent_plain_and_forced_deletes_answer_204_404_or_409(
    idle_client: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    """10 plain and 10 ``force`` deletes of one model, then of one dataset, that a queued
    comparison uses, fired together from 20 threads: each answer is 204, 404 or 409 (one
    204 in all), never a 500, and nothing of the comparison is left."""
    client = idle_client
    ids = register(client, zoo, "mixer_digits", "sw_mlp_digits")
    images = np.random.default_rng(0).random((8, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "eight.npz", x=images)
    ds = upload_dataset(client, tmp_path / "eight.npz")
    for dataset in (digits_id(client), ds):
        r = client.post("/v1/comparisons", json={"model_ids": ids, "dataset_id": dataset})
        assert r.status_code == 202, r.text
    services: Services = client.app.state.services  # type: ignore[attr-defined]

    def storm(url: str) -> list[int]:
        start = threading.Barrier(20)

        def fire(k: int) -> int:
            start.wait(timeout=30)
            return client.delete(url, params={"force": k % 2 == 0}).status_code

        with ThreadPoolExecutor(20) as pool:
            return list(pool.map(fire, range(20)))

    for url in (f"/v1/models/{ids[0]}", f"/v1/datasets/{ds}"):
        codes = storm(url)
        assert set(codes) <= {204, 404, 409} and codes.count(204) == 1, (url, codes)
        assert client.get(url).status_code == 404
    with services.db.session(readonly=True) as s:  # both comparisons went with the model
        assert s.scalar(select(func.count()).select_from(Comparison)) == 0
        assert s.scalar(select(func.count()).select_from(Job)) == 0


def test_concurrent_deletes_of_a_running_comparison_answer_204_or_404(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    """20 deletes of one comparison whose job is running and heartbeating, fired together:
    one 204, the others 404, never a 500; the heartbeat finds its job gone. The delete locks
    the job (after its ancestors, as a heartbeat does) and then the comparison, so a second
    delete waits and finds no row."""
    from app.jobs.queue import LostJob, claim, heartbeat

    client = idle_client
    ids = register(client, zoo, "mixer_digits")
    r = client.post("/v1/comparisons", json={"model_ids": ids, "dataset_id": digits_id(client)})
    assert r.status_code == 202, r.text
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    cid = r.json()["id"]
    with services.db.session(readonly=True) as s:
        job_id = s.get(Comparison, cid).job_id  # type: ignore[union-attr]
    assert claim(services.db, "w:test", job_id) is not None
    start = threading.Barrier(21)
    beats: list[object] = []

    def beat() -> None:
        start.wait(timeout=30)
        try:
            for _ in range(10_000):
                heartbeat(services.db, job_id, "w:test", 0.5)
        except LostJob as exc:
            beats.append(exc)
        except BaseException as exc:
            beats.append(exc)

    def fire(_: int) -> int:
        start.wait(timeout=30)
        return client.delete(f"/v1/comparisons/{cid}").status_code

    beating = threading.Thread(target=beat)
    beating.start()
    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(fire, range(20)))
    beating.join(60)
    assert sorted(set(codes)) == [204, 404] and codes.count(204) == 1, codes
    assert len(beats) == 1 and isinstance(beats[0], LostJob), beats
    assert client.get(f"/v1/comparisons/{cid}").status_code == 404


# 7. The broker restarted without persistence ----------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this test alone, without persistence: stopping it loses its queues."""
    with RedisServer() as server:
        yield server


# Celery workers run beside PostgreSQL, the GPU host's stack (docs/deploy.md); SQLite has the
# in-process worker, whose faults run on both databases.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_broker_restarted_without_persistence_loses_no_queued_job(
    own_redis: RedisServer,
    settings: Settings,
    cifar_zoo: dict[str, Path],
    slow_data: Path,
    tmp_path: Path,
) -> None:
    """One real Celery worker runs a comparison while a second waits in Redis; Redis is
    stopped (the waiting message is gone), a third comparison is posted while it is down
    (202: kept and published later), and Redis is started again, empty. Without touching the
    worker, its reaper publishes both again once they have waited CKA_QUEUED_GRACE_S, and
    each runs once."""
    import redis

    queue = f"cka-lost-{uuid.uuid4().hex[:10]}"
    config = settings.model_copy(
        update={"broker_url": own_redis.url, "celery_queue": queue, "queued_grace_s": 1.0}
    )
    env = service_env(config.resolved_database_url, config.data_dir)
    env |= {"CKA_BROKER_URL": own_redis.url, "CKA_CELERY_QUEUE": queue, "CKA_QUEUED_GRACE_S": "1"}
    broker = redis.Redis.from_url(own_redis.url)
    with TestClient(create_app(config)) as client:  # with a broker the API only enqueues
        db, first = submit_slow(client, cifar_zoo, slow_data)
        worker = Proc(["worker"], env, tmp_path / "worker.log")
        try:
            poll(lambda: running(db, first), 90, "the worker started the first job", (worker,))
            ids = [m["id"] for m in client.get(f"/v1/comparisons/{first}").json()["models"]]
            body = {
                "model_ids": ids[:1],
                "dataset_id": job_dataset(client, first),
                "batch_size": 50,
            }
            before = broker.llen(queue)  # the worker's start re-sent the first job too
            r = client.post("/v1/comparisons", json=body)
            assert r.status_code == 202, r.text
            waiting = r.json()["id"]
            assert broker.llen(queue) == before + 1, "the second job's message is not in Redis"
            own_redis.stop()
            assert job_of(db, first).status == "running", "the first job ended too early"
            r = client.post("/v1/comparisons", json={**body, "model_ids": ids[1:]})
            assert r.status_code == 202, r.text  # the broker is away: kept, published later
            late = r.json()["id"]
            own_redis.start()  # empty: the waiting message is lost
            assert broker.llen(queue) == 0
            poll(
                lambda: all(job_of(db, c).status in FINAL for c in (first, waiting, late)),
                120,
                "every comparison finished after the broker's restart",
                (worker,),
            )
        finally:
            worker.stop(timeout=10)
            broker.close()
        jobs = {c: job_of(db, c) for c in (first, waiting, late)}
        assert all(j.status == "succeeded" and j.attempts == 1 for j in jobs.values()), {
            c: (j.status, j.attempts, j.error) for c, j in jobs.items()
        }
        assert "publishing queued jobs" in worker.output(), worker.output()
        assert assert_consistent(db)["succeeded"] == 3


def job_dataset(client: TestClient, comparison_id: int) -> int:
    return int(client.get(f"/v1/comparisons/{comparison_id}").json()["dataset_id"])
