"""Helpers for tests/app/test_faults.py: real processes, real services, bounded waits.

Every wait polls with a deadline and, when a process it depends on has exited, fails at
once with that process's output, so a fault test never hangs and never fails mutely.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import func, select

from app.store.db import Database
from app.store.orm import Comparison, ComparisonModel, Job
from tests.helpers import FINAL

CIFAR = ("mixer_cifar", "gmlp_cifar")
SLOW_N = 600  # images in the slow dataset: 24 batches of 25, a few seconds per comparison


def slow_npz(path: Path, n: int) -> Path:
    """``n`` random 32x32 RGB images: with the *_cifar presets a job of a few seconds."""
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8))
    return path


def upload_dataset(client: httpx.Client, path: Path) -> int:
    with path.open("rb") as f:
        r = client.post("/v1/datasets", files={"file": (path.name, f)})
    assert r.status_code in (200, 201), r.text
    return int(r.json()["id"])


class Proc:
    """A ``python -m app.cli ...`` child in its own process group, output to a log file."""

    def __init__(self, args: list[str], env: Mapping[str, str], log: Path, **kw: Any) -> None:
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "app.cli", *args],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kw,
            )

    def output(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def check_alive(self, what: str) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(
                f"{what}: the process {self.popen.args[3:]} exited with "
                f"{self.popen.returncode}; its output:\n{self.output()}"
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` to the whole group and wait; SIGKILL if it outlives ``timeout``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            return self.popen.wait(10)


def poll(
    predicate: Callable[[], Any], timeout: float, what: str, procs: tuple[Proc, ...] = ()
) -> Any:
    """Call ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            p.check_alive(what)
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.log.name}:\n{p.output(3000)}" for p in procs)
            raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {value!r})\n{logs}")
        time.sleep(0.05)


def wait_serving(http: httpx.Client, server: Proc, timeout: float = 60) -> None:
    """Poll the ``cka-atlas serve`` child until it answers ``/healthz`` (fail at once if it
    exits, or after ``timeout``)."""

    def up() -> bool:
        try:
            return http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    poll(up, timeout, "cka-atlas serve answered /healthz", (server,))


def service_env(db_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``cka-atlas`` child: fast heartbeats, a short stale horizon."""
    return {
        "CKA_DATABASE_URL": db_url,
        "CKA_DATA_DIR": str(data_dir),
        "CKA_DEVICE": "cpu",
        "CKA_HEARTBEAT_S": "0.2",
        "CKA_STALE_AFTER_S": "2",
        "CKA_POLL_S": "0.2",
        "CKA_LOG_FORMAT": "text",
        "CKA_LOG_LEVEL": "info",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def job_of(db: Database, comparison_id: int) -> Job:
    with db.session(readonly=True) as s:
        cmp = s.get(Comparison, comparison_id)
        assert cmp is not None, f"comparison {comparison_id} is gone"
        return cmp.job


def assert_consistent(db: Database) -> dict[str, int]:
    """No orphan rows; every succeeded comparison has one full result, no other one has any."""
    with db.session(readonly=True) as s:
        cmps = list(s.scalars(select(Comparison)))
        n_jobs = s.scalar(select(func.count()).select_from(Job))
        n_members = s.scalar(select(func.count()).select_from(ComparisonModel))
        assert n_jobs == len(cmps) == len({c.job_id for c in cmps}), (n_jobs, len(cmps))
        assert n_members == sum(len(c.params["model_ids"]) for c in cmps)
        for c in cmps:
            done = c.job.status == "succeeded"
            fields = (c.result, c.result_sha256, c.diagnostics, c.provenance)
            assert all(f is not None for f in fields) if done else all(f is None for f in fields)
            if done:
                k = len(c.params["model_ids"])
                pairs = [(m["a"], m["b"]) for m in c.result["matrices"]]  # type: ignore[index]
                assert len(pairs) == len(set(pairs)) == k * (k + 1) // 2, pairs
        return {
            "comparisons": len(cmps),
            "succeeded": sum(c.job.status == "succeeded" for c in cmps),
            "failed": sum(c.job.status == "failed" for c in cmps),
            "unfinished": sum(c.job.status not in FINAL for c in cmps),
        }


# The artifact store made read-only or full: a real tmpfs when this process may mount (root
# in a VM or a privileged container); else, over an ordinary directory, a worker process that
# may not write the store's 0555 directories (root without CAP_DAC_OVERRIDE) or may not grow
# a file past 4 MiB (RLIMIT_FSIZE).

FSIZE_LIMIT = 4 << 20
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 1, 2, 3


def try_mount_tmpfs(path: Path, size: str = "64m") -> bool:
    if os.environ.get("CKA_TEST_NO_MOUNT"):
        return False
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def remount(path: Path, mode: str) -> None:
    done = subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True)
    assert done.returncode == 0, f"remount,{mode} {path}: {done.stderr.decode()}"


def umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    """Write a file until the filesystem under ``path`` has no block left."""
    filler = path / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while f.write(block):
                    pass
    assert os.statvfs(path).f_bavail == 0, "the filler did not fill the store"
    return filler


def chmod_dirs(root: Path, mode: int) -> None:
    for d in (root, *(p for p in root.rglob("*") if p.is_dir())):
        d.chmod(mode)


def _without_dac_override() -> None:  # in the child between fork and exec
    """Root keeps its uid (so it can still run an interpreter under /root) but loses the
    capabilities that ignore file modes; a non-root process needs nothing dropped."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _limit_file_size() -> None:  # in the child between fork and exec
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal death
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def unprivileged_worker(fault: str, env: dict[str, str], log: Path) -> Proc:
    """``cka-atlas worker`` that cannot write the store (chmod it 0555 first), or that may
    not grow a file past ``FSIZE_LIMIT``."""
    drop = _without_dac_override if fault == "read-only" else _limit_file_size
    return Proc(["worker", "--threads", "1"], env, log, preexec_fn=drop)
