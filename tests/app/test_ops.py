"""Operations: /healthz, /readyz, Prometheus /metrics, and JSON logs with the job id."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from app.http.main import create_app
from app.http.ops import _duration_histogram, check_broker, check_device
from app.logs import JsonFormatter, job_context, uvicorn_log_config
from app.store.settings import Settings
from tests.helpers import digits_id, make_settings, register, wait


def samples(client: TestClient, **headers: str) -> dict[tuple[str, frozenset[Any]], float]:
    """Every sample of /metrics as {(name, labels): value}."""
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sqlite_settings(tmp_path: Path, **kw: Any) -> Settings:
    return make_settings(f"sqlite:///{tmp_path / 'ops.db'}", tmp_path / "data", **kw)


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ready"
    assert {k: v["ok"] for k, v in body["checks"].items()} == {
        "database": True,
        "broker": True,
        "device": True,
    }
    assert body["checks"]["device"]["detail"] == "cpu"


def test_readyz_fails_on_an_outdated_schema(tmp_path: Path) -> None:
    with TestClient(create_app(sqlite_settings(tmp_path))) as c:
        engine = c.app.state.services.db.engine  # type: ignore[attr-defined]
        with engine.begin() as conn:
            head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            conn.execute(text("UPDATE alembic_version SET version_num = 'old'"))
        r = c.get("/readyz")
        assert r.status_code == 503
        database = r.json()["checks"]["database"]
        assert not database["ok"] and "cka-atlas db upgrade" in database["detail"]
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :h"), {"h": head})
        assert c.get("/readyz").status_code == 200


def test_readyz_fails_when_the_broker_is_unreachable(tmp_path: Path) -> None:
    # Port 1 on loopback refuses connections at once.
    settings = sqlite_settings(tmp_path, broker_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings)) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "not_ready"
    assert not body["checks"]["broker"]["ok"] and body["checks"]["database"]["ok"]


def test_broker_and_device_checks(redis_url: str) -> None:
    assert check_broker(None).ok
    assert check_broker(redis_url).ok  # the session's Redis
    assert not check_broker("redis://127.0.0.1:1/0", timeout=1).ok
    assert check_device("cpu").ok
    missing = check_device("cuda:99")
    assert not missing.ok and "cuda:99" in missing.detail


def test_metrics_requests_jobs_and_memory(client: TestClient, zoo: dict[str, Path]) -> None:
    ids = register(client, zoo, "mixer_digits", "gmlp_digits")
    r = client.post(
        "/v1/comparisons",
        json={"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 90},
    )
    assert r.status_code == 202, r.text
    done = wait(client, f"/v1/comparisons/{r.json()['id']}")
    assert done["status"] == "succeeded"
    assert client.get("/v1/comparisons/99999").status_code == 404
    assert client.get("/no/such/page").status_code == 404

    m = samples(client)
    route = "/v1/comparisons/{comparison_id}"
    key = frozenset({"route": route, "method": "GET", "status": "404"}.items())
    assert m[("cka_http_request_duration_seconds_count", key)] == 1
    unmatched = frozenset({"route": "<unmatched>", "method": "GET", "status": "404"}.items())
    assert m[("cka_http_request_duration_seconds_count", unmatched)] == 1
    # Raw paths never become labels: cardinality stays bounded.
    assert not any("99999" in str(labels) for _, labels in m)

    def job(name: str, **labels: str) -> float:
        return m[(name, frozenset(labels.items()))]

    assert job("cka_jobs", kind="comparison", status="succeeded") == 1
    assert job("cka_jobs", kind="comparison", status="queued") == 0
    assert job("cka_job_oldest_queued_age_seconds") == 0
    assert job("cka_job_duration_seconds_count", kind="comparison", status="succeeded") == 1
    started = datetime.fromisoformat(done["started_at"])
    finished = datetime.fromisoformat(done["finished_at"])
    expected = (finished - started).total_seconds()
    got = job("cka_job_duration_seconds_sum", kind="comparison", status="succeeded")
    assert got == pytest.approx(expected, abs=1e-3)
    assert job("cka_device_memory_bytes", device="cpu", kind="resident") > 0


def test_duration_histogram_buckets() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    spans = [
        ("comparison", "succeeded", t0, t0 + timedelta(seconds=0.3)),
        ("comparison", "succeeded", t0, t0 + timedelta(seconds=4)),
        ("comparison", "succeeded", t0, t0 + timedelta(seconds=100)),
        ("training", "failed", t0, t0 + timedelta(seconds=7000)),
    ]
    family = _duration_histogram(spans)
    got = {(s.name, s.labels["kind"], s.labels.get("le")): s.value for s in family.samples}
    assert got[("cka_job_duration_seconds_bucket", "comparison", "0.25")] == 0
    assert got[("cka_job_duration_seconds_bucket", "comparison", "0.5")] == 1
    assert got[("cka_job_duration_seconds_bucket", "comparison", "5.0")] == 2
    assert got[("cka_job_duration_seconds_bucket", "comparison", "120.0")] == 3
    assert got[("cka_job_duration_seconds_bucket", "comparison", "+Inf")] == 3
    assert got[("cka_job_duration_seconds_sum", "comparison", None)] == pytest.approx(104.3)
    assert got[("cka_job_duration_seconds_bucket", "training", "3600.0")] == 0
    assert got[("cka_job_duration_seconds_bucket", "training", "7200.0")] == 1


def test_metrics_need_a_token_when_reads_do(tmp_path: Path) -> None:
    settings = sqlite_settings(tmp_path, api_tokens="s3cret", read_requires_token=True)
    with TestClient(create_app(settings)) as c:
        assert c.get("/metrics").status_code == 401
        assert samples(c, Authorization="Bearer s3cret")
        assert c.get("/healthz").status_code == 200  # probes stay open
        assert c.get("/readyz").status_code == 200


def _format(record_args: dict[str, Any]) -> dict[str, Any]:
    record = logging.LogRecord(
        "app.test", logging.INFO, __file__, 1, "job %s: %s", (7, "done"), None, **record_args
    )
    return dict(json.loads(JsonFormatter().format(record)))


def test_json_formatter_fields_and_job_context() -> None:
    plain = _format({})
    assert plain["message"] == "job 7: done" and plain["level"] == "info"
    assert plain["logger"] == "app.test" and "job_id" not in plain
    datetime.fromisoformat(plain["time"])
    with job_context(42, "comparison"):
        inside = _format({})
        with job_context(43, "training"):
            assert _format({})["job_id"] == 43
        assert _format({})["job_id"] == 42
    assert inside["job_id"] == 42 and inside["job_kind"] == "comparison"
    assert "job_id" not in _format({})
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    record.comparison_id = 5
    record.color_message = "\x1b[32mfailed\x1b[0m"  # what uvicorn adds to its records
    doc = json.loads(JsonFormatter().format(record))
    assert doc["exc_type"] == "ValueError" and "boom" in doc["traceback"]
    assert doc["comparison_id"] == 5 and "color_message" not in doc


def test_job_logs_carry_the_job_id(client: TestClient, zoo: dict[str, Path]) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("app.jobs.run")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        ids = register(client, zoo, "mixer_digits")
        body = {"model_ids": ids, "dataset_id": digits_id(client), "batch_size": 150}
        r = client.post("/v1/comparisons", json=body)
        done = wait(client, f"/v1/comparisons/{r.json()['id']}")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    job_lines = [d for d in lines if "started on" in d["message"] or "succeeded" in d["message"]]
    assert len(job_lines) == 2 and done["status"] == "succeeded"
    job_ids = {d["job_id"] for d in job_lines}
    assert len(job_ids) == 1 and all(d["job_kind"] == "comparison" for d in job_lines)
    assert f"job {job_ids.pop()} " in job_lines[0]["message"]


def test_uvicorn_log_config_is_valid() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved_loggers = {
        n: (
            list(logging.getLogger(n).handlers),
            logging.getLogger(n).level,
            logging.getLogger(n).propagate,
        )
        for n in names
    }
    try:
        logging.config.dictConfig(uvicorn_log_config("warning"))
        handler = logging.getLogger("uvicorn.access").handlers[0]
        assert isinstance(handler.formatter, JsonFormatter)
        assert logging.getLogger("uvicorn.access").level == logging.WARNING
    finally:
        for h in list(root.handlers):
            if h not in saved[0]:
                root.removeHandler(h)
        for h in saved[0]:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(saved[1])
        for n, (handlers, level, propagate) in saved_loggers.items():
            lg = logging.getLogger(n)
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


def test_every_response_says_nosniff_and_static_files_have_cache_headers(tmp_path: Path) -> None:
    from app.http.static import IMMUTABLE
    from app.http.web.templating import static_url

    with TestClient(create_app(sqlite_settings(tmp_path, worker_threads=0))) as c:
        answers = {
            path: c.get(path)
            for path in (
                "/healthz",
                "/v1/models",
                "/v1/models/999",  # a problem
                "/openapi.json",
                "/metrics",
                "/",
                "/login",
                static_url("style.css"),
                "/static/style.css",
                "/static/nope.css",
                "/docs",
            )
        }
        answers["POST /v1/jobs/1/cancel"] = c.post("/v1/jobs/1/cancel")
        answers["Host: evil.example"] = c.get("/v1/models", headers={"Host": "evil.example"})
        assets = [u for u in c.get("/docs").text.split('"') if u.startswith("/docs/assets/")]
        asset = c.get(assets[0])
        stale = c.get("/static/style.css?v=000000000000")
        revalidated = c.get(
            static_url("style.css"),
            headers={"If-None-Match": answers[static_url("style.css")].headers["etag"]},
        )
    assert {p: r.headers.get("x-content-type-options") for p, r in answers.items()} == {
        p: "nosniff" for p in answers
    }
    assert answers[static_url("style.css")].headers["cache-control"] == IMMUTABLE
    assert revalidated.status_code == 304 and revalidated.headers["cache-control"] == IMMUTABLE
    assert answers["/static/style.css"].headers["cache-control"] == "no-cache"
    assert stale.headers["cache-control"] == "no-cache"
    assert asset.status_code == 200 and asset.headers["cache-control"] == "public, max-age=86400"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_access_log_names_the_token_and_never_a_secret(tmp_path: Path, fmt: str) -> None:
    """The real server (uvicorn's access log): a request authorised with a database token is
    logged with the token's name; a token sent in the query string (never accepted) is not
    logged; no secret appears anywhere in the server's output."""
    import httpx

    from app.store.db import Database, ensure_schema
    from app.store.tokens import create_token
    from tests.app.fault_tools import Proc, service_env, wait_serving
    from tests.servers import free_port

    db_url = f"sqlite:///{tmp_path / 'cka.db'}"
    db = Database(db_url)
    ensure_schema(db.engine)
    with db.session() as s:
        _, secret = create_token(s, "ci-bot", "write")
    db.dispose()
    env = service_env(
        db_url, tmp_path / "data", CKA_WORKER_THREADS="0", CKA_LOG_FORMAT=fmt, CKA_ACCESS_LOG="true"
    )
    port = free_port()
    server = Proc(["serve", "--port", str(port)], env, tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            wait_serving(http, server)
            auth = {"Authorization": f"Bearer {secret}"}
            assert http.get("/v1/models?limit=3", headers=auth).status_code == 200
            assert http.post("/v1/jobs/1/cancel", headers=auth).status_code == 404
            assert http.get(f"/v1/datasets?token={secret}&limit=2").status_code == 200
            assert http.get(f"/v1/comparisons?access_token={secret}").status_code == 200
    finally:
        server.stop()
    log = server.log.read_text()
    assert secret not in log and secret[4:20] not in log
    lines = [line for line in log.splitlines() if '"GET /v1/' in line or '"POST /v1/' in line]
    if fmt == "json":
        docs = [json.loads(line) for line in lines]
        named = {d["message"].split('"')[1]: d.get("token_name") for d in docs}
    else:
        named = {
            line.split('"')[1]: (line.rsplit("(token ", 1)[1][1:-2] if "(token " in line else None)
            for line in lines
        }
    assert named == {
        "GET /v1/models?limit=3 HTTP/1.1": "ci-bot",
        "POST /v1/jobs/1/cancel HTTP/1.1": "ci-bot",
        "GET /v1/datasets?token=[redacted]&limit=2 HTTP/1.1": None,
        "GET /v1/comparisons?access_token=[redacted] HTTP/1.1": None,
    }, lines


def test_serve_refuses_to_start_when_reads_need_a_token_and_there_is_none(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.app.fault_tools import service_env
    from tests.servers import free_port

    env = service_env(f"sqlite:///{tmp_path / 'cka.db'}", tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
        env={**os.environ, **env, "CKA_READ_REQUIRES_TOKEN": "true"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "CKA_READ_REQUIRES_TOKEN" in error[0]
    assert "cka-atlas token create --scope admin" in error[0] and "CKA_API_TOKENS" in error[0]
