"""``cka-atlas serve`` as a process of its own, for the benchmarks that measure the real server.

:func:`serve` starts ``python -m app.cli serve`` on a free loopback port over a data directory of
the run's own, with the process's environment minus every ``CKA_`` variable plus the settings
the benchmark gives; waits until ``/readyz`` answers; optionally starts a ``cka-atlas worker``
process beside it (the API then only enqueues, as on a GPU host); and stops both at the end,
gracefully (the API with SIGINT, so its lifespan runs; the worker with SIGTERM, so a running job
goes back to the queue).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["Server", "ServerError", "free_port", "serve"]

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180.0


class ServerError(RuntimeError):
    """The server exited or did not become ready; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """The running server: its process, base URL and log (JSON lines at the service's level)."""

    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process so far (Linux only)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def error_lines(self) -> list[str]:
        out = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                level = json.loads(line).get("level")
            except (json.JSONDecodeError, AttributeError):
                level = "error" if "Traceback" in line else None
            if level in ("error", "critical"):
                out.append(line)
        return out


@contextlib.contextmanager
def serve(
    data_dir: Path, settings: Mapping[str, str], *, worker_process: bool = False
) -> Iterator[Server]:
    """The API over ``data_dir`` with the ``CKA_`` ``settings`` given, ready; with
    ``worker_process``, a ``cka-atlas worker --threads 1`` beside it (give the API
    ``CKA_WORKER_THREADS=0`` then). Logs go to ``server.log`` and ``worker.log`` beside
    ``data_dir``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKA_")}
    env |= {"CKA_DATA_DIR": str(data_dir), "CKA_HOST": "127.0.0.1", "CKA_PORT": str(port)}
    env |= settings
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / "server.log"
    server = Server(_start(["serve"], env, log), f"http://127.0.0.1:{port}", log)
    worker: subprocess.Popen[bytes] | None = None
    try:
        _wait_ready(server)
        if worker_process:
            worker = _start(["worker", "--threads", "1"], env, data_dir.parent / "worker.log")
        yield server
    finally:
        if worker is not None:
            _stop(worker, signal.SIGTERM)
        _stop(server.proc, signal.SIGINT)


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", *command],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if server.proc.poll() is not None:
            raise ServerError(f"the server exited with {server.proc.returncode}:\n{server.tail()}")
        try:
            if httpx.get(f"{server.base}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(
                f"the server was not ready within {READY_TIMEOUT_S:.0f} s:\n{server.tail()}"
            )
        time.sleep(0.25)


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Stop ``proc`` with ``sig``, and kill it if it has not ended within 45 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(45)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
