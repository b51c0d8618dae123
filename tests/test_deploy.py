"""The container files agree with the code: variable names, ports, volumes and commands.

No container engine runs on our machines, so this reads Dockerfile and docker-compose.yml as
text and checks each claim they make against the settings class, the CLI parser, the app's
routes and README.
"""

from __future__ import annotations

import io
import os
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from app.cli import build_parser, main
from app.store.settings import Settings
from tests.app.payloads import assert_problem
from tests.image.compose import service_environment

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
# The user's documentation: README and the reference it links in docs/.
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
SETTINGS_VARS = {f"CKA_{name.upper()}" for name in Settings.model_fields}


def _dockerfile_instructions(keyword: str) -> list[str]:
    """Instruction arguments, with backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [
        line.split(None, 1)[1]
        for line in joined.splitlines()
        if line.split(None, 1)[:1] == [keyword] and len(line.split(None, 1)) == 2
    ]


def _dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for args in _dockerfile_instructions("ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def _command_argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    if command is None:
        import json

        return list(json.loads(_dockerfile_instructions("CMD")[-1]))
    return list(command) if isinstance(command, list) else shlex.split(command)


def _cka_invocations(argv: list[str]) -> list[list[str]]:
    """Every ``cka-atlas ...`` call in a command, also inside ``sh -c "a && b"``."""
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in argv[2].split("&&")]
    return [argv]


def test_every_cka_variable_is_a_setting() -> None:
    names = set(_dockerfile_env())
    for service in COMPOSE["services"].values():
        names |= set(service.get("environment", {}))
    used = {name for name in names if name.startswith("CKA_")}
    assert used, "the container files configure nothing"
    assert used <= SETTINGS_VARS, f"unknown settings: {sorted(used - SETTINGS_VARS)}"


def test_readme_documents_every_setting() -> None:
    missing = sorted(name for name in SETTINGS_VARS if name not in DOCS)
    assert not missing, f"the configuration table (docs/configuration.md) lacks {missing}"


@pytest.mark.parametrize("name", ["api", "worker"])
def test_commands_are_real_cli_commands(name: str) -> None:
    parser = build_parser()
    for argv in _cka_invocations(_command_argv(COMPOSE["services"][name])):
        assert argv[0] == "cka-atlas"
        parser.parse_args(argv[1:])  # exits (SystemExit) on an unknown command or option


def test_ports_agree() -> None:
    env = _dockerfile_env()
    port = env["CKA_PORT"]
    assert port in _dockerfile_instructions("EXPOSE")[0].split()
    # The healthcheck asks the port the container was started with (shell form).
    healthcheck = _dockerfile_instructions("HEALTHCHECK")[0]
    assert ":${CKA_PORT}/healthz" in healthcheck and "CMD [" not in healthcheck
    api = COMPOSE["services"]["api"]
    assert api["environment"]["CKA_PORT"] == port
    assert api["environment"]["CKA_HOST"] == "0.0.0.0"
    assert any(mapping.endswith(f":{port}") for mapping in api["ports"])


def test_healthcheck_hits_a_real_route() -> None:
    from fastapi.testclient import TestClient

    from app.http.main import create_app

    # Without the lifespan nothing touches a database: /healthz must answer all the same.
    # The container's check asks localhost, a name the service always answers to.
    client = TestClient(create_app(start_worker=False), base_url="http://localhost:8000")
    assert client.get("/healthz").status_code == 200


def test_data_volume_is_the_data_dir_and_shared() -> None:
    data_dir = _dockerfile_env()["CKA_DATA_DIR"]
    assert data_dir in " ".join(_dockerfile_instructions("VOLUME"))
    mounts = {}
    for name in ("api", "worker"):
        service = COMPOSE["services"][name]
        env_dir = service["environment"].get("CKA_DATA_DIR", data_dir)
        assert env_dir == data_dir
        (volume,) = [v.split(":")[0] for v in service["volumes"] if v.endswith(f":{data_dir}")]
        mounts[name] = volume
    # The worker reads the checkpoints the API stored: both must mount the same volume.
    assert mounts["api"] == mounts["worker"] and mounts["api"] in COMPOSE["volumes"]


def test_services_reach_each_other() -> None:
    services = COMPOSE["services"]
    env = services["api"]["environment"]
    assert env["CKA_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["CKA_DATABASE_URL"]
    assert env["CKA_BROKER_URL"].startswith("redis://redis:6379")
    pg = services["postgres"]["environment"]
    user, password = pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"]
    assert f"://{user}:{password}@postgres:5432/{pg['POSTGRES_DB']}" in env["CKA_DATABASE_URL"]
    assert services["worker"]["environment"]["CKA_BROKER_URL"] == env["CKA_BROKER_URL"]


def test_worker_reserves_a_gpu_and_image_runs_unprivileged() -> None:
    devices = COMPOSE["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices)
    users = _dockerfile_instructions("USER")
    assert users and users[-1] not in {"root", "0"}
    # The base is a build argument whose default is the CUDA runtime image.
    assert _dockerfile_instructions("FROM") == ["${BASE}"]
    name, _, default = _dockerfile_instructions("ARG")[0].partition("=")
    assert name == "BASE" and default.startswith("nvidia/cuda:") and "runtime" in default


def test_install_commands_match_readme() -> None:
    installs = [r for r in _dockerfile_instructions("RUN") if "pip install" in r]
    assert installs, "the Dockerfile installs nothing"
    for step in (s.strip() for run in installs for s in run.split("&&")):
        assert step in DOCS, f"Dockerfile installs with '{step}', which the docs do not give"


def test_locked_dependencies_install_before_the_source_is_copied() -> None:
    """A code change must not invalidate the layer that holds torch."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE).splitlines()
    locked = next(
        i for i, line in enumerate(joined) if "--require-hashes -r requirements.lock" in line
    )
    copies = [i for i, line in enumerate(joined) if line.startswith("COPY")]
    lock_copy = next(i for i in copies if "requirements.lock" in joined[i])
    source_copies = [i for i in copies if any(f" {p}" in joined[i] for p in ("models", "app"))]
    assert lock_copy < locked < min(source_copies), joined
    assert (ROOT / "requirements.lock").read_text().count("--hash=sha256:") > 20


def _cka_environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """``env`` becomes this process's whole ``CKA_`` environment, as in a container."""
    for key in [k for k in os.environ if k.startswith("CKA_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any]]]:
    """What `cka-atlas serve` hands to uvicorn (the app and the bind), instead of serving it."""
    import uvicorn

    import app.cli.service

    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    monkeypatch.setattr(app.cli.service, "_logging", lambda settings: None)
    return calls


def test_serve_refuses_every_interface_without_allowed_hosts(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    served: list[tuple[Any, dict[str, Any]]],
) -> None:
    """Bound to 0.0.0.0 with no names configured, any Host would be answered (DNS rebinding):
    `serve` refuses in one sentence naming the setting, before it serves anything."""
    data = {"CKA_DATA_DIR": str(tmp_path)}
    for env, argv in [
        ({"CKA_HOST": "0.0.0.0"}, []),
        ({"CKA_ALLOWED_HOSTS": " , "}, ["--host", "::"]),
    ]:
        _cka_environment(monkeypatch, data | env)
        assert main(["serve", *argv]) == 2
        error = capsys.readouterr().err
        assert error.startswith("error: ") and error.count("\n") == 1, error
        assert "CKA_ALLOWED_HOSTS" in error and served == []
    # With the names clients use, or bound to one address, it serves.
    for env in [{"CKA_HOST": "0.0.0.0", "CKA_ALLOWED_HOSTS": "atlas.lab.example"}, {}]:
        _cka_environment(monkeypatch, data | env)
        assert main(["serve"]) == 0, capsys.readouterr().err
    assert [kw["host"] for _, kw in served] == ["0.0.0.0", "127.0.0.1"]


@pytest.mark.parametrize("allowed", [None, "atlas.lab.example"])
def test_the_compose_api_answers_only_its_host_names(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    served: list[tuple[Any, dict[str, Any]]],
    allowed: str | None,
) -> None:
    """`cka-atlas serve` with docker-compose.yml's API environment (CKA_ALLOWED_HOSTS unset:
    the file's default; set: the operator's name) refuses a rebound `Host: evil.example`,
    reads and writes alike, and serves the configured name."""
    from fastapi.testclient import TestClient

    environ = {"CKA_API_TOKENS": "compose-token"}
    if allowed is not None:
        environ["CKA_ALLOWED_HOSTS"] = allowed
    env = service_environment(COMPOSE, "api", environ)
    # The compose file's database and broker are other containers; here, a SQLite file and
    # the in-process worker.
    del env["CKA_BROKER_URL"]
    env |= {"CKA_DATABASE_URL": f"sqlite:///{tmp_path / 'atlas.db'}", "CKA_DATA_DIR": str(tmp_path)}
    _cka_environment(monkeypatch, env)
    assert main(["serve"]) == 0
    ((app, bind),) = served
    assert bind["host"] == "0.0.0.0"
    name = allowed or "localhost"
    auth = {"Authorization": "Bearer compose-token"}
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((4, 8, 8), np.uint8))
    with TestClient(app, base_url=f"http://{name}:8000") as c:
        assert c.get("/v1/models").status_code == 200
        for host in ("evil.example", "evil.example:8000"):
            assert_problem(c.get("/v1/models", headers={"Host": host}), 400, "invalid_host")
            upload = c.post(
                "/v1/datasets",
                files={"file": ("d.npz", buffer.getvalue())},
                headers={"Host": host, **auth},
            )
            assert_problem(upload, 400, "invalid_host")
        assert c.get("/v1/datasets").json()["total"] == 1  # digits only: nothing was stored
