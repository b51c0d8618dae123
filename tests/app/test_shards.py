"""Sharded comparisons through the service: equal to one piece, shard jobs, cancel, failure,
the stale reaper. (Two Celery workers and a killed one: tests/app/test_celery.py.)"""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.http.main import create_app
from app.jobs import run
from app.jobs.parking import PARKED
from app.jobs.queue import claim, fail, heartbeat
from app.jobs.reaper import requeue_stale
from app.jobs.run import execute, run_claimed
from app.store.orm import Comparison, Job, utcnow
from app.store.services import Services
from tests.app.payloads import assert_problem
from tests.helpers import (
    assert_same_numbers,
    digits_id,
    make_settings,
    register,
    stored_result,
    wait,
)


def _services(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


def _job_of(services: Services, comparison_id: int) -> int:
    with services.db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        assert cmp is not None
        return cmp.job_id


# The numbers of three shards against one piece: shard claims, progress and cancel run on both
# databases in the tests below, so this comparison of results runs on one.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sharded_comparison_equals_one_piece(
    client: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    """The same comparison in one piece and in 3 shards, each in a store of its own (so
    neither reuses the other's Grams): the stored results agree to 1e-9."""
    body: dict[str, Any] = {
        "batch_size": 50,  # 450 test images: 9 batches
        "bootstrap": 30,
        "permutations": 15,
        "sensitivity": True,
    }
    names = ("mixer_digits", "gmlp_digits", "mlp_digits")
    whole = client.post(
        "/v1/comparisons",
        json=body | {"model_ids": register(client, zoo, *names), "dataset_id": digits_id(client)},
    )
    one = wait(client, whole.headers["location"])
    alone = make_settings(f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "b")
    with TestClient(create_app(alone)) as other:
        ids = register(other, zoo, *names)
        body |= {"model_ids": ids, "dataset_id": digits_id(other), "shards": 3}
        sharded = other.post("/v1/comparisons", json=body)
        assert sharded.status_code == 202, sharded.text
        three = wait(other, sharded.headers["location"])
        assert one["status"] == three["status"] == "succeeded", three
        assert three["params"]["shards"] == 3
        r1 = stored_result(_services(client), whole.json()["id"])
        r3 = stored_result(_services(other), sharded.json()["id"])
        assert {"ci_low", "p_value", "null_mean", "effective_dim"} <= set(r3), sorted(r3)
        assert_same_numbers(r1, r3)

        shards = three["diagnostics"].pop("shards")
        assert [s["shard"] for s in shards] == [0, 1, 2]
        assert [s["batches"] for s in shards] == [[0, 3], [3, 6], [6, 9]]  # tiles the plan
        assert sum(s["n"] for s in shards) == three["diagnostics"]["n_used"] == 450
        assert all(s["worker"] and s["host"] and s["seconds"] >= 0 for s in shards)
        assert three["diagnostics"]["forward_passes"] == one["diagnostics"]["forward_passes"]
        assert set(three["diagnostics"]["forward_passes"].values()) == {9}

        job_id = _job_of(_services(other), sharded.json()["id"])
        listed = other.get("/v1/jobs", params={"kind": "shard", "parent_id": job_id}).json()
        assert listed["total"] == 3
        assert {j["status"] for j in listed["items"]} == {"succeeded"}
        assert {j["links"]["parent"] for j in listed["items"]} == {f"/v1/jobs/{job_id}"}
        assert not (_services(other).store.tmp / f"shards-{sharded.json()['id']}").exists()


def test_sharding_is_refused_for_full_mode(client: TestClient, zoo: dict[str, Path]) -> None:
    ids = register(client, zoo, "mlp_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "mode": "full", "shards": 2}
    r = client.post("/v1/comparisons", json=body)
    assert_problem(r, 422, "shards_need_minibatch")
    assert r.json()["field"] == "shards"
    too_many = body | {"mode": "minibatch", "shards": 65}
    assert client.post("/v1/comparisons", json=too_many).status_code == 422


def _park(client: TestClient, zoo: dict[str, Path], shards: int = 3) -> tuple[int, list[int]]:
    """A sharded comparison whose job has run once: parked, its shards queued."""
    services = _services(client)
    ids = register(client, zoo, "mlp_digits", "mixer_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "shards": shards}
    cmp = client.post("/v1/comparisons", json=body | {"batch_size": 60}).json()
    parent = _job_of(services, cmp["id"])
    assert execute(services, "test:host:1:parent", parent) is not None
    with services.db.session(readonly=True) as s:
        row = s.get(Job, parent)
        assert row is not None and (row.status, row.worker_id) == ("running", PARKED)
        children = list(s.scalars(select(Job.id).where(Job.parent_id == parent)))
    assert len(children) == shards
    return parent, children


def _status(services: Services, job_id: int) -> str:
    with services.db.session(readonly=True) as s:
        row = s.get(Job, job_id)
        assert row is not None
        return row.status


def test_cancel_reaches_every_shard(idle_client: TestClient, zoo: dict[str, Path]) -> None:
    client, services = idle_client, _services(idle_client)
    parent, children = _park(client, zoo)
    running = claim(services.db, "test:host:2:w", children[0])
    assert running is not None

    r = client.post(f"/v1/jobs/{parent}/cancel")
    assert r.json()["status"] == "running"  # one shard still runs: it stops at its next batch
    assert [_status(services, c) for c in children] == ["running", "cancelled", "cancelled"]
    with services.db.session(readonly=True) as s:
        assert s.get(Job, children[0]).cancel_requested  # type: ignore[union-attr]

    # the running shard sees the request, stops, and the comparison ends cancelled with it
    run_claimed(services, running, "test:host:2:w")
    assert _status(services, children[0]) == "cancelled"
    assert client.get(f"/v1/jobs/{parent}").json()["status"] == "cancelled"


def test_a_failed_shard_fails_the_comparison(idle_client: TestClient, zoo: dict[str, Path]) -> None:
    client, services = idle_client, _services(idle_client)
    parent, children = _park(client, zoo, shards=2)
    claimed = claim(services.db, "test:host:3:w", children[0])
    assert claimed is not None
    fail(services.db, children[0], "test:host:3:w", "a bad batch", "invalid_input")
    assert execute(services, "test:host:4:w", children[1]) is not None  # the last one settles
    assert _status(services, children[1]) == "succeeded"
    job = client.get(f"/v1/jobs/{parent}").json()
    assert job["status"] == "failed"
    assert job["error"] == "shard 1 of 2 failed: a bad batch"
    assert job["error_code"] == "invalid_input"


def test_progress_sums_the_shards_and_the_reaper_waits_for_them(
    idle_client: TestClient, zoo: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, services = idle_client, _services(idle_client)
    parent, children = _park(client, zoo, shards=2)
    first = claim(services.db, "test:host:5:w", children[0])
    assert first is not None
    heartbeat(services.db, children[0], "test:host:5:w", 0.5)
    assert client.get(f"/v1/jobs/{parent}").json()["progress"] == 0.25  # (0.5 + 0) / 2

    def age(job_id: int) -> None:
        with services.db.session() as s:
            old = utcnow() - timedelta(hours=1)
            s.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=old))

    age(parent)
    # a shard may still run: the parked comparison is left alone, the stale shard re-queued,
    # and, none of them having beaten for a minute, the queued ones are sent again (once)
    age(children[0])
    assert sorted(requeue_stale(services.db, 60.0)) == sorted(children)
    assert _status(services, parent) == "running"
    assert _status(services, children[0]) == "queued"
    assert requeue_stale(services.db, 60.0) == []

    # both shards end, but the worker of the last one dies before it takes the comparison
    # over: once stale, the comparison is re-queued, and its next run combines the shards
    monkeypatch.setattr(run, "_settle", lambda *args: None)
    for child in children:
        assert execute(services, "test:host:6:w", child) is not None
        assert _status(services, child) == "succeeded"
    age(parent)
    assert requeue_stale(services.db, 60.0) == [parent]
    assert execute(services, "test:host:7:w", parent) is not None
    done = client.get(f"/v1/jobs/{parent}").json()
    assert done["status"] == "succeeded" and done["worker"] == "test:host:7:w"


def test_many_batches_are_sharded_by_the_setting(tmp_path: Path, zoo: dict[str, Path]) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "data", shard_batches=4)
    with TestClient(create_app(settings)) as client:
        ids = register(client, zoo, "mlp_digits")
        body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 45}
        done = wait(client, client.post("/v1/comparisons", json=body).headers["location"])
    assert done["status"] == "succeeded"
    # 450 images in batches of 45: 10 batches, at most 4 per shard -> 3 shards tiling them
    ranges = [s["batches"] for s in done["diagnostics"]["shards"]]
    assert len(ranges) == 3 and ranges[0][0] == 0 and ranges[-1][1] == 10
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
