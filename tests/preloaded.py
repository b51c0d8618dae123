"""An interpreter that has imported the command line once and forks a child per command.

Each ``cka-atlas`` process and each ``python -c`` example spends most of its life importing torch,
timm and torchvision (seconds each, dozens of processes in the docs' examples). A
:class:`Preloaded` process imports :mod:`app.cli` with every command's module and the two
libraries once, then listens on a Unix socket; a small client (:meth:`Preloaded.shim`, an
executable named like the command it stands for) hands it its argv, working directory,
environment and its stdin, stdout and stderr, and the preloaded process forks a child that runs
``app.cli.main(argv)`` (or ``exec``'s a Python block) exactly as a fresh process would, then
hands back its exit status. The child's modules are the ones a fresh process would import; only
the import is shared. Forking is safe: the preloaded process is single-threaded and has run no
torch operation (its thread pools start lazily, in the child).

Run as ``python -m tests.preloaded SOCKET``; :class:`Preloaded` starts and stops it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, Self

READY_TIMEOUT_S = 120.0
_LENGTH = 8  # bytes of the request's length prefix
_MAX_FDS = 3

# The client: its own interpreter starts in milliseconds (it imports nothing of the project).
_SHIM = """#!{python}
import json, os, socket, sys
request = json.dumps({{"mode": {mode!r}, "argv": sys.argv[1:], "cwd": os.getcwd(),
                      "env": dict(os.environ)}}).encode()
with socket.socket(socket.AF_UNIX) as s:
    s.connect({socket!r})
    socket.send_fds(s, [len(request).to_bytes({length}, "big") + request], [0, 1, 2])
    answer = b""
    while chunk := s.recv(64):
        answer += chunk
sys.exit(int(answer or b"1"))
"""


def _preload() -> None:
    """Import what the commands and the examples import: the CLI with every command's module,
    the service stack, and the libraries' public names (which load on first use)."""
    import importlib

    from app.cli import build_parser

    build_parser()  # imports every app.cli command module
    for package in ("analysis", "analysis.studies", "models", "app.http.main"):
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            getattr(module, name)
    for module in (
        "matplotlib.figure",
        "matplotlib.backends.backend_agg",
        "scipy.stats",
        "sklearn.datasets",
    ):
        importlib.import_module(module)


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """Runs one request in the forked child and returns its exit status."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import random

    import numpy as np

    random.seed()  # a fresh process seeds from the OS, not from its parent's state
    np.random.seed()
    argv: list[str] = request["argv"]
    try:
        if request["mode"] == "python":
            if argv[:1] != ["-c"] or len(argv) < 2:
                print("preloaded python: only `python -c CODE` is supported", file=sys.stderr)
                return 2
            sys.argv, sys.path[0] = ["-c", *argv[2:]], ""  # as `python -c` sets them
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            return 0
        from app.cli import main

        sys.argv, sys.path[0] = ["cka-atlas", *argv], str(Path(sys.executable).parent)
        return main(argv)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def serve(path: str) -> None:
    """Preload, then fork a child per request on the Unix socket at ``path`` until killed."""
    _preload()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for _ in sel.select(timeout=0.05):
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                code = _child(request, fds)
                atexit._run_exitfuncs()  # what the interpreter's exit would run
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os._exit(code & 0xFF)
            for fd in fds:
                os.close(fd)
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
            conn.close()


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, _MAX_FDS)
    while len(data) < _LENGTH or len(data) < _LENGTH + int.from_bytes(data[:_LENGTH], "big"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the client left before its request was whole")
        data += chunk
    return json.loads(data[_LENGTH:]), list(fds)


class Preloaded:
    """The preloaded process, started with ``env`` and stopped (with every child it forked)."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.socket = str(folder / "preloaded.sock")
        self.log = folder / "preloaded.log"
        self.bin = folder / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        root = str(Path(__file__).resolve().parents[1])
        env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.preloaded", self.socket],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while b"ready" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the preloaded interpreter did not start:\n{self.output()}")
            time.sleep(0.05)

    def shim(self, name: str, mode: str = "cli") -> Path:
        """An executable ``name`` in :attr:`bin` that runs through this process: ``cli``, a
        ``cka-atlas`` command line; ``python``, ``python -c CODE``."""
        path = self.bin / name
        path.write_text(
            _SHIM.format(python=sys.executable, mode=mode, socket=self.socket, length=_LENGTH)
        )
        path.chmod(0o755)
        return path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its children are in its session
        self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    serve(sys.argv[1])
