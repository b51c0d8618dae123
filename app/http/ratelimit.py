"""Write rate limits per token (per client address without one), with the ``limits`` library.

``CKA_WRITE_RATE`` (``60/minute``, ``1000/hour``, ``10/second;500/hour``...) caps the writes
and uploads of each caller, and the sign-ins (``POST /login``) of each client address; empty
turns it off. Counters live in Redis when
``CKA_BROKER_URL`` names one (so every API process shares them), in process memory
otherwise. Past the limit a write is refused with 429 and ``Retry-After`` (seconds until the
window resets), as problem+json. A counter store that cannot be reached lets the write
through and logs one line: a Redis hiccup must not take writes down with it.
"""

from __future__ import annotations

import logging
import math
import time

from limits import RateLimitItem, parse_many
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter

from app.http.problems import ProblemError
from app.store.settings import Settings

__all__ = ["WriteLimiter", "make_limiter"]

log = logging.getLogger(__name__)


class WriteLimiter:
    """Fixed-window counters of writes per caller key (``token:7``, ``addr:10.0.0.5``...)."""

    def __init__(
        self, rates: list[RateLimitItem], storage: Storage, namespace: str = "cka-write"
    ) -> None:
        self.rates = rates
        self.namespace = namespace
        self.storage = storage
        self._limiter = FixedWindowRateLimiter(storage)
        self._failing = False

    def hit(self, key: str, what: str = "writes") -> None:
        """Count one write (or one of ``what``) of ``key``; raise the 429 problem if any rate
        is exceeded."""
        try:
            for rate in self.rates:
                if not self._limiter.hit(rate, self.namespace, key):
                    reset = self._limiter.get_window_stats(rate, self.namespace, key).reset_time
                    wait = max(1, math.ceil(reset - time.time()))
                    raise ProblemError(
                        429,
                        "rate_limited",
                        f"more than {rate} {what}; try again in {wait} s",
                        headers={"Retry-After": str(wait)},
                    )
        except ProblemError:
            raise
        except Exception as exc:  # the counter store is away: do not refuse writes for it
            if not self._failing:
                log.warning("write rate limit not enforced: its store failed (%s)", exc)
            self._failing = True
        else:
            self._failing = False


def make_limiter(settings: Settings) -> WriteLimiter | None:
    """The limiter ``settings`` ask for, or None when ``CKA_WRITE_RATE`` is empty."""
    if not settings.write_rate.strip():
        return None
    rates = parse_many(settings.write_rate)
    broker = settings.broker_url or ""
    uri = broker if broker.startswith(("redis://", "rediss://")) else "memory://"
    storage = storage_from_string(uri)
    assert isinstance(storage, Storage)  # a synchronous URI gives a synchronous storage
    # Deployments sharing one Redis keep their counters apart by their queue's name.
    return WriteLimiter(rates, storage, f"cka-write:{settings.celery_queue}")
