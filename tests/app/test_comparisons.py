"""Comparisons through the job system: results, idempotency, cancel, stale jobs, stored Grams."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from app.jobs.queue import LostJob, claim, complete
from app.jobs.reaper import requeue_stale
from app.jobs.run import run_claimed
from app.store.orm import Comparison, Job, utcnow
from app.store.services import Services
from tests.helpers import digits_id, register, run_until_final, wait

BATCH = 150  # digits test split: 450 images -> 3 batches


def submit(client: TestClient, ids: list[int], **kw: object) -> object:
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": BATCH, **kw}
    return client.post("/v1/comparisons", json=body)


def test_comparison_result_matrix_heatmap(client: TestClient, zoo: dict[str, Path]) -> None:
    ids = register(client, zoo, "mixer_digits", "mlp_digits")
    r = submit(client, ids)
    assert r.status_code == 202
    body = wait(client, r.headers["location"])
    assert body["status"] == "succeeded" and body["progress"] == 1.0, body
    prov = body["provenance"]
    assert set(prov["checkpoints"].values()) == {
        client.get(f"/v1/models/{i}").json()["sha256"] for i in ids
    }
    assert (
        prov["dataset"]["sha256"]
        == client.get(f"/v1/datasets/{digits_id(client)}").json()["sha256"]
    )
    assert prov["device"] == "cpu" and prov["code_version"] and prov["dtype"]
    assert body["diagnostics"]["n_used"] == 450
    m = client.get(f"{r.headers['location']}/matrix", params={"a": "mixer_digits"}).json()
    assert m["a"] == m["b"] == "mixer_digits"
    assert len(m["values"]) == len(m["rows"]) and len(m["values"][0]) == len(m["cols"])
    diag = [m["values"][i][i] for i in range(len(m["rows"]))]
    assert all(v is None or math.isclose(v, 1.0, rel_tol=1e-6) for v in diag)
    cross = client.get(f"{r.headers['location']}/matrix", params={"a": ids[0], "b": ids[1]}).json()
    assert cross["b"] == "mlp_digits"
    values = np.array(cross["values"], dtype=float)
    assert np.all(np.isnan(values) | (values <= 1.0 + 1e-9))
    assert client.get(f"{r.headers['location']}/matrix", params={"a": "zzz"}).status_code == 422
    first = client.get(f"{r.headers['location']}/matrix", params={"a": ids[0], "b": ids[1]})
    again = client.get(
        f"{r.headers['location']}/matrix",
        params={"a": "mixer_digits", "b": "mlp_digits"},
        headers={"If-None-Match": first.headers["etag"]},
    )
    assert again.status_code == 304 and again.headers["etag"] == first.headers["etag"]
    png = client.get(f"{r.headers['location']}/heatmap.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    etag = png.headers["etag"]
    again = client.get(f"{r.headers['location']}/heatmap.png", headers={"If-None-Match": etag})
    assert again.status_code == 304
    svg = client.get(f"{r.headers['location']}/heatmap.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml") and svg.headers["etag"] != etag


def test_identical_request_returns_stored_comparison(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    ids = register(client, zoo, "mixer_digits", "gmlp_digits")
    first = submit(client, ids)
    wait(client, first.headers["location"])
    same = submit(client, ids)
    assert same.status_code == 200 and same.headers["location"] == first.headers["location"]
    forced = submit(client, ids, force=True)
    assert forced.status_code == 202 and forced.headers["location"] != first.headers["location"]
    assert wait(client, forced.headers["location"])["status"] == "succeeded"
    other = submit(client, ids, kernel="rbf")
    assert other.status_code == 202


def test_cancel_queued_and_running(idle_client: TestClient, zoo: dict[str, Path]) -> None:
    client = idle_client
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    ids = register(client, zoo, "mixer_digits", "rp_mixer_digits")
    queued = submit(client, ids)
    url = queued.headers["location"]
    assert client.post(f"{url}/cancel").json()["status"] == "cancelled"
    assert client.get(f"{url}/matrix").status_code == 409
    running = submit(client, ids)  # a cancelled identical comparison is recomputed
    assert running.status_code == 202
    job = claim(services.db, "test-worker")
    assert job is not None
    assert client.post(f"{running.headers['location']}/cancel").json()["status"] == "running"
    run_claimed(services, job, "test-worker")  # stops at its first batch boundary
    body = client.get(running.headers["location"]).json()
    assert body["status"] == "cancelled" and body["diagnostics"] is None


def test_stale_job_is_requeued_and_killed_worker_writes_nothing(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    client = idle_client
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    ids = register(client, zoo, "mixer_digits", "mlp_digits")
    url = submit(client, ids).headers["location"]
    dead = claim(services.db, "dead-worker")
    assert dead is not None
    with services.db.session() as s:
        s.execute(
            update(Job)
            .values(heartbeat_at=utcnow() - timedelta(seconds=600))
            .where(Job.id == dead.id)
        )
    body = run_until_final(client, services, url)  # re-queues the stale job, then runs it
    assert body["status"] == "succeeded" and body["attempts"] == 2
    # The killed worker coming back cannot overwrite or duplicate the result.
    with services.db.session() as s:
        try:
            complete(s, dead.id, "dead-worker")
            raise AssertionError("a worker that lost its job completed it")
        except LostJob:
            pass
    with services.db.session() as s:
        assert s.scalar(select(func.count()).select_from(Comparison)) == 1


def test_a_job_that_keeps_killing_its_worker_is_failed_not_requeued(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    client = idle_client
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    url = submit(client, register(client, zoo, "mlp_digits")).headers["location"]
    limit = services.settings.max_attempts
    for attempt in range(1, limit + 1):
        job = claim(services.db, f"doomed-{attempt}")
        assert job is not None, f"attempt {attempt}: the job was not back in the queue"
        with services.db.session() as s:
            s.execute(
                update(Job)
                .values(heartbeat_at=utcnow() - timedelta(seconds=600))
                .where(Job.id == job.id)
            )
        requeued = requeue_stale(services.db, 60, limit)
        assert requeued == ([job.id] if attempt < limit else [])
    body = client.get(url).json()
    assert body["status"] == "failed" and body["attempts"] == limit
    assert body["error_code"] == "worker_lost" and "stopped responding" in body["error"]
    assert claim(services.db, "another") is None


def test_stored_grams_skip_forward_of_known_models(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    a, b, c = register(client, zoo, "mixer_digits", "sw_mlp_digits", "gmlp_digits")
    first = wait(client, submit(client, [a, b]).headers["location"])
    assert first["diagnostics"]["gram_cache"]["hits"] == 0
    second = wait(client, submit(client, [a, b, c]).headers["location"])
    cache = second["diagnostics"]["gram_cache"]
    batches = second["diagnostics"]["batches"]
    assert batches == 3
    assert cache["hits"] == 2 * batches and cache["misses"] == batches
    # per batch the a-a, a-b and b-b HSIC blocks are read back; only c's three are computed
    assert cache["blocks_reused"] == 3 * batches and cache["blocks_computed"] == 3 * batches
    m1 = client.get(f"/v1/comparisons/{first['id']}/matrix", params={"a": a, "b": b}).json()
    m2 = client.get(f"/v1/comparisons/{second['id']}/matrix", params={"a": a, "b": b}).json()
    assert m1["values"] == m2["values"]


def test_training_registers_a_model(client: TestClient) -> None:
    r = client.post(
        "/v1/trainings",
        json={"arch": "mlp_digits", "dataset_id": digits_id(client), "epochs": 1, "seed": 3},
    )
    assert r.status_code == 202, r.text
    body = wait(client, r.headers["location"], timeout=180)
    assert body["status"] == "succeeded", body
    model = client.get(f"/v1/models/{body['model_id']}").json()
    assert model["source"] == "training" and model["arch"] == "mlp_digits"
    # On the worker's device (the test settings' CKA_DEVICE), as the sidecar and the page say.
    where = model["sidecar"]["training"]
    assert where["device"] == "cpu" and where["precision"] == "fp32" and where["deterministic"]
    page = client.get(f"/models/{model['id']}").text
    assert f'<dd id="training-device"><code>cpu</code> · {where["device_name"]} · fp32' in page
    bad = client.post("/v1/trainings", json={"arch": "nope", "dataset_id": digits_id(client)})
    assert bad.status_code == 422 and bad.json()["field"] == "arch"


def test_stored_matrix_equals_the_library(client: TestClient, zoo: dict[str, Path]) -> None:
    """What the service stores and serves is what ``analysis.compare`` gives on the same
    checkpoints, data and options: the job, the Gram store and JSON change nothing."""
    import analysis
    import models

    names = ("mixer_digits", "gmlp_digits")
    ids = register(client, zoo, *names)
    r = submit(client, ids, layers="blocks.*", bootstrap=0)
    assert r.status_code == 202
    assert wait(client, r.headers["location"])["status"] == "succeeded"
    served = client.get(f"{r.headers['location']}/matrix", params={"a": ids[0], "b": ids[1]})
    got = np.array(served.json()["values"], dtype=float)

    nets = {name: models.load(zoo[name])[0].eval() for name in names}
    atlas = analysis.compare(
        nets, analysis.load_dataset("digits"), layers="blocks.*", batch_size=BATCH
    )
    expected = atlas.matrix(*names)
    assert expected.shape == got.shape and expected.size >= 4
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_one_skeleton_serves_every_seed_of_a_configuration() -> None:
    """Layer names and shapes are resolved on a weightless skeleton kept per configuration
    (its seed left out), so a worker that met one seed does not build another."""
    from app.jobs.submit import skeleton

    one = skeleton("sw_mlp_digits", {"density": 0.25, "seed": 1})
    assert skeleton("sw_mlp_digits", {"density": 0.25, "seed": 2}) is one
    assert skeleton("sw_mlp_digits", {"density": 0.5, "seed": 1}) is not one
    assert next(iter(one.parameters())).device.type == "meta"
