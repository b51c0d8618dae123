"""Cancel is per requester (app/jobs/cancel.py): a shared job stops only when nobody wants it.

Two write tokens (alice, bob) and an admin token (``CKA_API_TOKENS``) against an app without a
worker, so every job waits until the test runs it (:func:`app.jobs.run.execute`, in this
thread). On SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.http.main import create_app
from app.jobs.run import execute
from app.jobs.studies import atlas_body
from app.store.orm import Study
from app.store.services import Services
from app.store.settings import Settings
from app.store.tokens import create_token
from tests.app.payloads import assert_problem
from tests.app.study_tools import TINY, FakeTrainer
from tests.helpers import digits_id, register

ROOT = "root-secret"  # CKA_API_TOKENS: full access, an admin
# A study of two trainings (the Mixer reference, one RP-Mixer arm, one seed).
STUDY = {**TINY, "name": "shared", "seeds": 1, "arms": [{"name": "rp", "arch": "rp_mixer_digits"}]}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def app(settings: Settings) -> Iterator[tuple[TestClient, dict[str, dict[str, str]]]]:
    """The idle app with tokens; the headers of alice, bob (write) and root (admin), root's
    by default."""
    config = settings.model_copy(update={"api_tokens": ROOT, "worker_threads": 0})
    with TestClient(create_app(config), headers=bearer(ROOT)) as client:  # uploads, reads
        services = _services(client)
        with services.db.session() as s:
            alice, bob = (create_token(s, name, "write")[1] for name in ("alice", "bob"))
        yield client, {"alice": bearer(alice), "bob": bearer(bob), "root": bearer(ROOT)}


def _services(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def _run_all(services: Services) -> None:
    """Run every queued job in this thread, as one worker would, until none is left."""
    while execute(services, "test-worker") is not None:
        pass


def _holders(view: dict[str, Any]) -> list[str]:
    return [h["label"] for h in view["held_by"]]


def test_one_requesters_cancel_leaves_the_shared_comparison_to_the_other(
    app: tuple[TestClient, dict[str, dict[str, str]]], zoo: dict[str, Path]
) -> None:
    client, who = app
    ids = register(client, zoo, "mixer_digits", "gmlp_digits")  # type: ignore[arg-type]
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    first = client.post("/v1/comparisons", json=body, headers=who["alice"])
    second = client.post("/v1/comparisons", json=body, headers=who["bob"])
    assert (first.status_code, second.status_code) == (202, 200), second.text
    url = first.headers["location"]
    assert second.headers["location"] == url  # one job, shared

    # alice withdraws: bob still wants it, so it stays queued; asking twice changes nothing
    for _ in range(2):
        mine = client.post(f"{url}/cancel", headers=who["alice"])
        assert mine.status_code == 200, mine.text
        assert mine.json()["status"] == "queued", mine.json()
        assert _holders(mine.json()) == ["bob"]
    assert _holders(second.json()) == ["alice", "bob"]  # who held it before
    _run_all(_services(client))
    done = client.get(url).json()
    assert done["status"] == "succeeded" and done["error"] is None, done

    # bob's own comparison: alice may not cancel it, bob may, and then it stops at once
    again = client.post("/v1/comparisons", json={**body, "batch_size": 90}, headers=who["bob"])
    own = again.headers["location"]
    assert _holders(again.json()) == ["bob"]
    problem = assert_problem(client.post(f"{own}/cancel", headers=who["alice"]), 403, "forbidden")
    assert "not requested by this token" in problem["detail"]
    job_id = client.get("/v1/jobs", params={"status": "queued"}).json()["items"][0]["id"]
    assert_problem(client.post(f"/v1/jobs/{job_id}/cancel", headers=who["alice"]), 403, "forbidden")
    stopped = client.post(f"{own}/cancel", headers=who["bob"]).json()
    assert stopped["status"] == "cancelled" and stopped["held_by"] == []
    assert "bob" in stopped["error"], stopped  # says who stopped it

    # bob submits it again (a cancelled comparison is recomputed): alice still cannot stop it,
    # an admin can, for both of them, and says so
    third = client.post("/v1/comparisons", json={**body, "batch_size": 90}, headers=who["bob"])
    renewed = third.headers["location"]
    assert third.status_code == 202 and renewed != own
    assert client.post("/v1/comparisons", json={**body, "batch_size": 90}, headers=who["alice"])
    assert _holders(client.get(renewed).json()) == ["bob", "alice"]
    assert_problem(
        client.post(f"{renewed}/cancel", params={"everyone": True}, headers=who["alice"]),
        403,
        "forbidden",
        "everyone",
    )
    ended = client.post(f"{renewed}/cancel", params={"everyone": True}, headers=who["root"])
    assert ended.json()["status"] == "cancelled" and ended.json()["held_by"] == []
    assert "by an admin" in ended.json()["error"]


def test_a_study_never_cancels_the_comparison_it_adopted(
    app: tuple[TestClient, dict[str, dict[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bob's study finds alice's identical comparison queued and waits for it: its view names
    the comparison at once; cancelling the study leaves alice's comparison running, and alice's
    cancel leaves the comparison to a study that holds it."""
    monkeypatch.setattr("app.jobs.study.train", FakeTrainer())
    client, who = app
    services = _services(client)

    def study(headers: dict[str, str]) -> tuple[str, int]:
        r = client.post("/v1/studies", json={"spec": STUDY, "quick": True}, headers=headers)
        assert r.status_code == 202, r.text
        return r.headers["location"], int(r.json()["job_id"])

    # A first study trains the models (by key, so the next studies reuse them) and its atlas.
    first, _ = study(who["bob"])
    _run_all(services)
    assert client.get(first).json()["status"] == "succeeded"
    with services.db.session(readonly=True) as s:
        done = s.get(Study, int(first.rsplit("/", 1)[1]))
        assert done is not None
        atlas = atlas_body(done, [m.model_id for m in done.members if m.model_id is not None])
    # alice asks for that atlas again, forced: a new queued comparison with the study's hash
    forced = {**atlas.model_dump(mode="json"), "force": True}
    posted = client.post("/v1/comparisons", json=forced, headers=who["alice"])
    assert posted.status_code == 202, posted.text
    cmp_url, cmp_id = posted.headers["location"], posted.json()["id"]

    # bob's second study reuses every training and adopts alice's comparison
    second, job = study(who["bob"])
    assert execute(services, "test-worker", job) is not None  # it parks, waiting for it
    view = client.get(second).json()
    assert view["status"] == "running" and view["stage"] == "comparison"
    study_id = view["id"]
    cancelled = client.post(f"{second}/cancel", headers=who["bob"]).json()
    assert cancelled["status"] == "cancelled", cancelled
    kept = client.get(cmp_url).json()
    assert kept["status"] == "queued", kept
    assert view["comparison_id"] == cmp_id  # from the moment of adoption
    assert _holders(kept) == ["alice"]
    # bob holds nothing of it any more: he may not cancel it
    assert_problem(client.post(f"{cmp_url}/cancel", headers=who["bob"]), 403, "forbidden")

    # A third study adopts it; now alice withdraws, and the study's interest keeps it alive.
    third, job = study(who["bob"])
    assert execute(services, "test-worker", job) is not None
    assert client.get(third).json()["comparison_id"] == cmp_id
    assert _holders(client.get(cmp_url).json()) == ["alice", STUDY["name"]]
    left = client.post(f"{cmp_url}/cancel", headers=who["alice"]).json()
    assert left["status"] == "queued" and [h["requester"] for h in left["held_by"]] == [
        f"study:{study_id + 1}"
    ]
    _run_all(services)
    assert client.get(cmp_url).json()["status"] == "succeeded"
    finished = client.get(third).json()
    assert finished["status"] == "succeeded" and finished["comparison_id"] == cmp_id


def test_without_tokens_everyone_is_one_requester(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    """The laptop mode: no token tells people apart, so every request is ``anonymous``'s
    and its cancel stops what only it holds."""
    client = idle_client
    ids = register(client, zoo, "mixer_digits", "gmlp_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    url = client.post("/v1/comparisons", json=body).headers["location"]
    view = client.post("/v1/comparisons", json=body).json()
    assert [h["requester"] for h in view["held_by"]] == ["anonymous"]
    assert client.post(f"{url}/cancel").json()["status"] == "cancelled"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_cancel_and_heartbeats_never_deadlock(db_url: str) -> None:
    """A parked comparison and its four running shards: in each of 40 rounds four threads
    heartbeat the shards (each beat updates its shard, then the parent) while a fifth cancels
    the parent — or, every other round, one shard, through the comparison it belongs to —
    all released by one barrier. A cancel locks the parent and then the shards; a heartbeat
    used to lock its shard and then the parent, and PostgreSQL aborted one of them with
    "deadlock detected". Locks now go top-down (app.jobs.parking): no error in any round,
    and every shard ends cancelled."""
    import threading

    from psycopg.errors import DeadlockDetected
    from sqlalchemy import select, update

    from app.jobs.cancel import Requester, cancel
    from app.jobs.parking import PARKED
    from app.jobs.queue import LostJob, enqueue, heartbeat
    from app.store.db import Database, ensure_schema
    from app.store.orm import Job, JobRequester, JobState, utcnow

    db = Database(db_url)
    ensure_schema(db.engine)
    admin = Requester("token:1", "ops", admin=True)
    errors: list[BaseException] = []
    try:
        for round_ in range(40):
            with db.session() as s:
                parent = enqueue(s, "comparison")
                s.add(JobRequester(job_id=parent.id, requester="token:1", label="ops"))
                shards = [enqueue(s, "shard", parent_id=parent.id, shard=i).id for i in range(4)]
                now = utcnow()
                s.execute(
                    update(Job)
                    .where(Job.id == parent.id)
                    .values(status=JobState.RUNNING, worker_id=PARKED, heartbeat_at=now)
                )
                for i, sid in enumerate(shards):
                    s.execute(
                        update(Job)
                        .where(Job.id == sid)
                        .values(status=JobState.RUNNING, worker_id=f"w:{i}", heartbeat_at=now)
                    )
                parent_id = parent.id
            barrier = threading.Barrier(5)
            target = parent_id if round_ % 2 == 0 else shards[round_ % 4]

            def beat(i: int, sid: int, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    for k in range(30):
                        if heartbeat(db, sid, f"w:{i}", k / 30):
                            return  # the cancel is seen: the job would stop now
                except LostJob:
                    return
                except BaseException as exc:
                    errors.append(exc)

            def stop(target: int = target, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    with db.session() as s:
                        cancel(s, target, admin, what=f"job {target}")
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=beat, args=(i, sid)) for i, sid in enumerate(shards)]
            threads.append(threading.Thread(target=stop))
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not any(t.is_alive() for t in threads), f"round {round_}: a thread hung"
            assert not errors, f"round {round_}: {errors[0]!r}"
            with db.session(readonly=True) as s:
                flags = s.scalars(select(Job.cancel_requested).where(Job.id.in_(shards))).all()
            assert all(flags), f"round {round_}: a shard was not asked to stop"
    finally:
        db.dispose()
    assert not any(isinstance(e, DeadlockDetected) for e in errors)
