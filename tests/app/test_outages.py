"""A part down or full (issue 36): the answer says "retry later" or "no room", never "bug".

1. PostgreSQL stopped under a running app: reads and writes answer 503 ``database_unavailable``
   with ``Retry-After`` (the test's own throwaway server), and 200/202 once it is back;
2. a SQLite database locked by another writer past the busy timeout: the write answers 503;
3. the broker unreachable wherever an endpoint meets it: 503 ``broker_unavailable``;
4. a nearly full store (a real tmpfs where this process may mount one): an upload needs its
   own size in the store, not twice it, and one that cannot fit is 507 ``storage_error``;
5. deleting a comparison whose job was cancelled removes the Grams it alone stored, and its
   view and page said how many bytes that would free.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import kombu.exceptions
import numpy as np
import pytest
import redis.exceptions
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from app.http.main import create_app
from app.http.problems import install_problem_handlers
from app.http.web.templating import fmt_bytes
from app.jobs.queue import claim
from app.jobs.run import run_claimed
from app.store.artifacts import ArtifactStore
from app.store.services import Services
from tests.app.fault_tools import fill, try_mount_tmpfs, umount
from tests.files import npz_bytes
from tests.helpers import digits_id, make_settings, register, run_until_final, upload
from tests.servers import PgServer


def assert_retry_later(r: httpx.Response, code: str, what: str) -> None:
    assert r.status_code == 503, (what, r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json", what
    assert r.json()["code"] == code, (what, r.text)
    assert int(r.headers["retry-after"]) > 0, what
    assert "\n" not in r.json()["detail"], r.text


def test_a_stopped_database_answers_503_with_retry_after_and_recovers(
    own_pg: PgServer, zoo: dict[str, Path], tmp_path: Path
) -> None:
    settings = make_settings(own_pg.url, tmp_path / "data", worker_threads=0)
    with TestClient(create_app(settings)) as client:
        ids = register(client, zoo, "mixer_digits", "gmlp_digits")
        body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
        upload = {"file": ("x.npz", npz_bytes(x=np.zeros((4, 8, 8), np.float32)))}
        own_pg.stop()
        answers = {
            "list": client.get("/v1/models"),
            "read": client.get(f"/v1/models/{ids[0]}"),
            "page": client.get("/"),
            "compare": client.post("/v1/comparisons", json=body),
            "upload": client.post("/v1/datasets", files=upload),
            "delete": client.delete(f"/v1/models/{ids[1]}"),
        }
        for what, r in answers.items():
            assert_retry_later(r, "database_unavailable", what)
        own_pg.start()
        assert client.get("/v1/models").json()["total"] == 2
        assert client.post("/v1/comparisons", json=body).status_code == 202
        assert client.post("/v1/datasets", files=upload).status_code == 201


def test_a_locked_sqlite_database_answers_503_to_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.store.db.SQLITE_BUSY_S", 0.2)
    path = tmp_path / "cka.db"
    settings = make_settings(f"sqlite:///{path}", tmp_path / "data", worker_threads=0)
    with TestClient(create_app(settings)) as client:
        upload = {"file": ("x.npz", npz_bytes(x=np.zeros((4, 8, 8), np.float32)))}
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            assert_retry_later(
                client.post("/v1/datasets", files=upload), "database_unavailable", "upload"
            )
            assert client.get("/v1/datasets").status_code == 200  # WAL: reads go on
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert client.post("/v1/datasets", files=upload).status_code == 201


@pytest.mark.parametrize(
    "error",
    [
        kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379."),
        redis.exceptions.ConnectionError("Connection refused"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
    ],
)
def test_an_unreachable_broker_answers_503_with_retry_after(error: Exception) -> None:
    app = FastAPI()
    install_problem_handlers(app)

    @app.post("/send")
    def send() -> None:
        raise error

    @app.post("/conflict")
    def conflict() -> None:  # a database error that is no outage stays a 500
        raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))

    with TestClient(app, raise_server_exceptions=False) as client:
        assert_retry_later(client.post("/send"), "broker_unavailable", type(error).__name__)
        assert client.post("/conflict").status_code == 500


# 4. A nearly full store --------------------------------------------------------------------


def leave_room(store: Path, nbytes: int, mounted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``nbytes`` the store's free space: on the tmpfs, fill it and give back that much
    of the filler; else make the store's free-space probe report it."""
    if not mounted:
        monkeypatch.setattr(ArtifactStore, "free_bytes", lambda self: nbytes)
        return
    filler = store / "filler"
    if not filler.exists():
        fill(store)
    filler.unlink()
    fill(store)
    with filler.open("r+b") as f:
        f.truncate(filler.stat().st_size - nbytes)


def post_upload(client: TestClient, kind: str, path: Path) -> httpx.Response:
    if kind == "checkpoint":
        return upload(client, path)
    with path.open("rb") as f:
        return client.post("/v1/datasets", files={"file": (path.name, f)})


def stored_files(store: Path) -> list[Path]:
    return [p for p in (store / "blobs").rglob("*") if p.is_file()]


@pytest.mark.parametrize("kind", ["checkpoint", "dataset"])
def test_an_upload_takes_its_size_once_and_507_when_it_does_not_fit(
    kind: str,
    db_url: str,
    zoo: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if kind == "checkpoint":
        path = zoo["mixer_digits"]
    else:  # random bytes: the file does not compress, so its size is what the store needs
        path = tmp_path / "noise.npz"
        path.write_bytes(npz_bytes(x=np.random.default_rng(0).random((400, 1, 8, 8))))
    size = path.stat().st_size
    store = tmp_path / "store"
    store.mkdir()
    mounted = try_mount_tmpfs(store, "16m")
    try:
        settings = make_settings(db_url, store, worker_threads=0)
        with TestClient(create_app(settings)) as client:
            # Room for one and a half copies: enough, as the upload is moved in, not copied.
            leave_room(store, size * 3 // 2, mounted, monkeypatch)
            r = post_upload(client, kind, path)
            assert r.status_code == 201, r.text
            assert not list((store / "tmp").iterdir())
            client.delete(r.headers["location"])
            before = stored_files(store)
            # Room for half of it: refused before a byte is written, saying what is missing.
            leave_room(store, size // 2, mounted, monkeypatch)
            r = post_upload(client, kind, path)
            assert r.status_code == 507, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["code"] == "storage_error"
            assert r.json()["detail"].startswith("the upload "), r.text
            assert (
                f"needs {size} bytes and the artifact store at {store} has " in r.json()["detail"]
            )
            assert "free; free some space" in r.json()["detail"], r.text
            assert stored_files(store) == before
            assert not list((store / "tmp").iterdir())
    finally:
        if mounted:
            umount(store)


# 5. What deleting a comparison frees ----------------------------------------------------------


def gram_files(services: Services) -> dict[str, int]:
    root = services.store.root
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in services.store.grams.rglob("*")
        if p.is_file()
    }


def test_deleting_a_cancelled_comparison_frees_the_grams_only_it_stored(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    client = idle_client
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    ids = register(client, zoo, "mixer_digits", "mlp_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
    first = client.post("/v1/comparisons", json=body).headers["location"]
    job = claim(services.db, "test-worker")
    assert job is not None
    client.post(f"{first}/cancel")
    run_claimed(services, job, "test-worker")  # stops after its first batch, Grams stored
    view = client.get(first).json()
    assert view["status"] == "cancelled", view
    stored = gram_files(services)
    assert stored, "the first batch stored no Grams"
    assert view["size_bytes"] == view["frees_bytes"] == sum(stored.values())
    page = client.get(f"/comparisons/{view['id']}").text
    assert f"deleting it frees {fmt_bytes(sum(stored.values()))}" in page

    # The same comparison again reuses some of them and stores the other batches' Grams.
    again = client.post("/v1/comparisons", json=body).headers["location"]
    assert run_until_final(client, services, again)["status"] == "succeeded"
    frees = client.get(first).json()["frees_bytes"]
    later = gram_files(services)
    assert set(stored) < set(later)
    assert client.delete(first).status_code == 204
    left = gram_files(services)
    gone = set(later) - set(left)
    assert gone <= set(stored) and sum(later[p] for p in gone) == frees  # as its view said
    assert client.get(again).json()["size_bytes"] == sum(left.values())  # the second's stay
    assert client.delete(again).status_code == 204
    assert gram_files(services) == {}
