"""Scoped tokens (read < write < admin), revocation, the login cookie, and write rate limits."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.cli import main
from app.http.main import create_app
from app.http.security import COOKIE_NAME, CSRF_HEADER
from app.store.db import Database
from app.store.orm import ApiToken
from app.store.settings import Settings
from tests.app.payloads import assert_problem


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def cli_token(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
) -> str:
    monkeypatch.setenv("CKA_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("CKA_DATA_DIR", str(settings.data_dir))
    assert main(["token", *args]) == 0
    return capsys.readouterr().out.strip()


def test_scopes_revocation_and_the_cli(
    settings: Settings,
    zoo: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    idle = settings.model_copy(update={"worker_threads": 0, "api_tokens": "from-env"})
    with TestClient(create_app(idle)) as c:  # creates the schema; the CLI then adds tokens
        admin = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "admin", "--name", "ops"
        )
        writer = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "write", "--name", "ci"
        )
        reader = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "read", "--name", "bi"
        )
        assert len({admin, writer, reader}) == 3 and all(
            t.startswith("cka_") for t in (admin, writer)
        )
        listed = cli_token(settings, monkeypatch, capsys, "list")
        assert "\tci\twrite\t" in listed and writer not in listed  # the secret is never shown again
        db = Database(str(settings.database_url))
        with db.session(readonly=True) as s:
            stored = {t.name: t.token_sha256 for t in s.scalars(select(ApiToken))}
        db.dispose()
        assert stored["ci"] == hashlib.sha256(writer.encode()).hexdigest()

        # read: reads only
        assert c.get("/v1/models", headers=bearer(reader)).status_code == 200
        body = assert_problem(
            c.post("/v1/jobs/1/cancel", headers=bearer(reader)), 403, "forbidden", "Authorization"
        )
        assert "read" in body["detail"] and "write" in body["detail"]
        # write: uploads and cancels, but no deletes and no token management
        r = c.post("/v1/models", headers=bearer(writer), files=_files(zoo["mlp_digits"]))
        assert r.status_code == 201, r.text
        model = r.json()["id"]
        assert_problem(c.delete(f"/v1/models/{model}", headers=bearer(writer)), 403, "forbidden")
        assert_problem(c.get("/v1/tokens", headers=bearer(writer)), 403, "forbidden")
        # admin: lists tokens (never their secrets), revokes, deletes
        tokens = c.get("/v1/tokens", headers=bearer(admin)).json()
        assert tokens["total"] == 3 and writer not in str(tokens)
        ci = next(t for t in tokens["items"] if t["name"] == "ci")
        assert (
            ci["scope"] == "write" and ci["last_used_at"] is not None and ci["revoked_at"] is None
        )
        revoked = c.post(f"/v1/tokens/{ci['id']}/revoke", headers=bearer(admin)).json()
        assert revoked["revoked_at"] is not None
        body = assert_problem(
            c.post("/v1/jobs/1/cancel", headers=bearer(writer)), 401, "unauthorized"
        )
        assert "revoked" in body["detail"]
        assert_problem(c.post("/v1/jobs/1/cancel", headers=bearer("cka_nope")), 401, "unauthorized")
        assert_problem(c.post("/v1/jobs/1/cancel"), 401, "unauthorized")
        assert c.delete(f"/v1/models/{model}", headers=bearer(admin)).status_code == 204
        # CKA_API_TOKENS keeps its full access: writes and deletes
        again = c.post("/v1/models", headers=bearer("from-env"), files=_files(zoo["mlp_digits"]))
        assert again.status_code == 201
        assert (
            c.delete(f"/v1/models/{again.json()['id']}", headers=bearer("from-env")).status_code
            == 204
        )
        # REST creation, then the CLI revokes it
        made = c.post("/v1/tokens", headers=bearer(admin), json={"name": "bot", "scope": "read"})
        assert made.status_code == 201 and made.json()["token"].startswith("cka_")
        cli_token(settings, monkeypatch, capsys, "revoke", str(made.json()["id"]))
        assert_problem(
            c.get("/v1/tokens", headers=bearer(made.json()["token"])), 401, "unauthorized"
        )


def _files(path: Path) -> dict[str, tuple[str, bytes]]:
    return {
        "weights": ("w.safetensors", path.read_bytes()),
        "sidecar": ("s.json", path.with_suffix(".json").read_bytes()),
    }


def test_login_cookie_takes_a_database_token(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(create_app(settings.model_copy(update={"worker_threads": 0}))) as c:
        writer = cli_token(settings, monkeypatch, capsys, "create", "--name", "page")
        assert c.post("/login", data={"token": "cka_wrong"}).status_code == 401
        ok = c.post("/login", data={"token": writer}, follow_redirects=False)
        assert ok.status_code == 303 and c.cookies.get(COOKIE_NAME) == writer
        assert_problem(c.post("/v1/jobs/1/cancel"), 401, "unauthorized")  # cookie without CSRF
        assert_problem(c.post("/v1/jobs/1/cancel", headers={CSRF_HEADER: "1"}), 404, "not_found")


@pytest.mark.parametrize("storage", ["memory", "redis"])
def test_writes_past_the_rate_get_429_with_retry_after(
    settings: Settings, storage: str, request: pytest.FixtureRequest
) -> None:
    # Redis only when this case needs one: the session's server, or a throwaway one.
    redis = request.getfixturevalue("redis_url") if storage == "redis" else None
    limited = settings.model_copy(
        update={
            "worker_threads": 0,
            "api_tokens": "alpha,beta",
            "write_rate": "3/minute",
            "broker_url": redis,
            "celery_queue": f"cka-test-{uuid.uuid4().hex[:10]}",  # its own Redis counters
        }
    )
    with TestClient(create_app(limited)) as c:
        for _ in range(3):  # counted, then answered (404: there is no such job)
            assert_problem(c.post("/v1/jobs/1/cancel", headers=bearer("alpha")), 404, "not_found")
        r = c.post("/v1/jobs/1/cancel", headers=bearer("alpha"))
        body = assert_problem(r, 429, "rate_limited")
        assert 1 <= int(r.headers["retry-after"]) <= 60 and "3 per 1 minute" in body["detail"]
        # another token has its own budget; reads are never limited
        assert c.post("/v1/jobs/1/cancel", headers=bearer("beta")).status_code == 404
        assert all(c.get("/v1/jobs").status_code == 200 for _ in range(5))
    # a fresh Settings: model_copy would keep the cached token set of the first one
    open_limited = Settings(**(limited.model_dump() | {"api_tokens": ""}))
    with TestClient(create_app(open_limited)) as c:  # no tokens: counted per client address
        codes = [c.post("/v1/jobs/1/cancel").status_code for _ in range(4)]
        assert codes == [404, 404, 404, 429]


def test_open_mode_cannot_be_claimed_over_http(client: TestClient) -> None:
    """A service without any token is open, every caller an anonymous admin: creating its
    first token is refused over HTTP (an operator makes it on the host), so the service stays
    open for everyone instead of locked by whoever asked first."""
    r = client.post("/v1/tokens", json={"name": "anyone", "scope": "read"})
    body = assert_problem(r, 403, "forbidden")
    assert "cka-atlas token create --scope admin" in body["detail"] and "host" in body["detail"]
    assert client.get("/v1/tokens").json()["total"] == 0  # nothing was created
    # and the anonymous writes it would have locked out still go through (404: no such job)
    assert_problem(client.post("/v1/jobs/1/cancel"), 404, "not_found")


def test_each_refusal_of_a_token_has_its_own_sentence(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No token, a token without "Bearer", Bearer without a token, a cookie without the CSRF
    header, an unknown token, a revoked one, one whose scope is too small: seven sentences,
    each saying what to do, none echoing the secret."""
    with TestClient(create_app(settings.model_copy(update={"worker_threads": 0}))) as c:
        admin = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "admin", "--name", "ops"
        )
        reader = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "read", "--name", "bi"
        )
        gone = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "write", "--name", "old"
        )
        old_id = next(
            t["id"]
            for t in c.get("/v1/tokens", headers=bearer(admin)).json()["items"]
            if t["name"] == "old"
        )
        assert c.post(f"/v1/tokens/{old_id}/revoke", headers=bearer(admin)).status_code == 200

        def refusal(status: int, **kw: object) -> str:
            code = "unauthorized" if status == 401 else "forbidden"
            body = assert_problem(c.post("/v1/jobs/1/cancel", **kw), status, code)  # type: ignore[arg-type]
            assert body["field"] == "Authorization" and gone not in body["detail"]
            assert reader not in body["detail"]
            return str(body["detail"])

        sentences = {
            "none": refusal(401),
            "no scheme": refusal(401, headers={"Authorization": reader}),
            "other scheme": refusal(401, headers={"Authorization": f"Token {reader}"}),
            "no token": refusal(401, headers={"Authorization": "Bearer"}),
            "unknown": refusal(401, headers=bearer("cka_nope")),
            "revoked": refusal(401, headers=bearer(gone)),
            "scope": refusal(403, headers=bearer(reader)),
        }
        c.cookies.set(COOKIE_NAME, admin)
        sentences["cookie without csrf"] = refusal(401)
        c.cookies.clear()
    assert "needs a bearer token" in sentences["none"]
    assert "CKA_API_TOKENS" in sentences["none"] and "cka-atlas token create" in sentences["none"]
    assert sentences["no scheme"] == sentences["other scheme"]  # the same mistake, one sentence
    assert "must read `Bearer <token>`" in sentences["no scheme"]
    assert "holds no token" in sentences["no token"]
    assert "not known to this service" in sentences["unknown"]
    assert "'old' was revoked at" in sentences["revoked"]
    assert "read scope" in sentences["scope"] and "needs write" in sentences["scope"]
    assert CSRF_HEADER in sentences["cookie without csrf"]
    distinct = {k: v for k, v in sentences.items() if k != "other scheme"}
    assert len(set(distinct.values())) == len(distinct), sentences


def test_revoking_the_last_token_says_the_service_stays_locked_and_how_to_open_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(create_app(settings.model_copy(update={"worker_threads": 0}))) as c:
        first = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "admin", "--name", "a"
        )
        second = cli_token(
            settings, monkeypatch, capsys, "create", "--scope", "admin", "--name", "b"
        )
        items = c.get("/v1/tokens", headers=bearer(first)).json()["items"]
        ids = {t["name"]: t["id"] for t in items}
        # not the last: no notice
        r = c.post(f"/v1/tokens/{ids['b']}/revoke", headers=bearer(first))
        assert r.status_code == 200 and r.json()["notice"] is None
        # the last one, over REST: the answer says the service stays locked, and how to open it
        r = c.post(f"/v1/tokens/{ids['a']}/revoke", headers=bearer(first))
        notice = r.json()["notice"]
        assert "stays locked" in notice and "cka-atlas token create" in notice
        assert "cka-atlas token purge" in notice
        # every refusal from now on says it too
        body = assert_problem(c.post("/v1/jobs/1/cancel"), 401, "unauthorized")
        assert "stays locked" in body["detail"]
        assert_problem(c.post("/v1/jobs/1/cancel", headers=bearer(second)), 401, "unauthorized")

        # over the CLI: a new token, revoked there; the output says the same
        cli_token(settings, monkeypatch, capsys, "create", "--name", "c")
        refused = assert_problem(c.post("/v1/jobs/1/cancel"), 401, "unauthorized")
        assert "stays locked" not in refused["detail"]
        db = Database(str(settings.database_url))
        with db.session(readonly=True) as s:
            third_id = s.scalar(select(ApiToken.id).where(ApiToken.name == "c"))
        db.dispose()
        out = cli_token(settings, monkeypatch, capsys, "revoke", str(third_id))
        assert out.startswith(f"token {third_id} revoked") and "stays locked" in out
        assert "cka-atlas token purge" in out
        # the documented command opens it again
        out = cli_token(settings, monkeypatch, capsys, "purge")
        assert "deleted 3 revoked tokens" in out and "the service is open" in out
        assert_problem(c.post("/v1/jobs/1/cancel"), 404, "not_found")  # open: past the auth


def test_the_sign_in_page_names_both_kinds_of_token(settings: Settings) -> None:
    env_only = settings.model_copy(update={"worker_threads": 0, "api_tokens": "s3cret"})
    with TestClient(create_app(env_only)) as c:
        page = c.get("/login").text
    assert "CKA_API_TOKENS" in page and "cka-atlas token create" in page


def test_sign_ins_are_rate_limited_like_writes(settings: Settings) -> None:
    limited = settings.model_copy(
        update={"worker_threads": 0, "api_tokens": "alpha", "write_rate": "3/minute"}
    )
    with TestClient(create_app(limited)) as c:
        codes = [c.post("/login", data={"token": f"guess-{i}"}).status_code for i in range(3)]
        assert codes == [401, 401, 401]
        r = c.post("/login", data={"token": "alpha"}, follow_redirects=False)  # right, but late
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
        assert "more than 3 per 1 minute sign-ins" in r.text and COOKIE_NAME not in r.headers.get(
            "set-cookie", ""
        )
        # writes of a token have their own count
        assert c.post("/v1/jobs/1/cancel", headers=bearer("alpha")).status_code == 404
