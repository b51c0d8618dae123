"""Suite-wide fixtures: bounded CPU use, and the PostgreSQL and Redis servers of the session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from tests import servers

# Two cores on CI, shared among the suite's processes (`make pytest` runs pytest-xdist's
# workers, which set PYTEST_XDIST_WORKER_COUNT): more threads than cores only adds contention.
_PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(min(2, torch.get_num_threads()) // _PROCESSES, 1))
# The service's workers size their threads from the environment's OMP_NUM_THREADS where it is
# set (app.jobs.threads): the apps of this process and the commands it starts use the same
# count as the references the tests compute here, on any machine.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The session's PostgreSQL: given, found on 127.0.0.1:5432, or a throwaway one."""
    with servers.postgres() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The session's Redis database: given, found on 127.0.0.1:6379, or a throwaway one."""
    with servers.redis() as url:
        yield url
