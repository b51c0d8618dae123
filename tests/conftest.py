"""Suite-wide fixtures: bounded CPU use, and the PostgreSQL and Redis servers of the session."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import torch

from tests import servers
from tests.deadline import Deadline

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


# When pytest-timeout's clock started for a test: before its fixtures are set up.
_STARTED = pytest.StashKey[float]()
# What a test keeps of its pytest-timeout limit to say, itself, what it waited for.
_MARGIN_S = 20.0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = time.monotonic()


@pytest.fixture
def deadline(request: pytest.FixtureRequest) -> Deadline:
    """The time this test has before pytest-timeout's limit (pyproject's ``timeout``, or the
    test's ``timeout`` mark) less a margin, counted from before its fixtures were set up: a
    long test takes each wait's bound from it, so it fails with its own sentence (what it
    waited for) instead of being killed mid-wait."""
    mark = request.node.get_closest_marker("timeout")
    limit = float(mark.args[0]) if mark and mark.args else float(request.config.getini("timeout"))
    return Deadline(request.node.stash[_STARTED] + limit - _MARGIN_S)
