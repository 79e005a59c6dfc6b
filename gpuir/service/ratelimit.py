"""Per-key rate limits of the service: a token bucket per API key, answered 429 with ``Retry-After``.

Each key (by its key id) has a bucket of ``burst`` tokens refilled at ``rate``
tokens per second; a request takes one token, and a request finding the bucket
empty is refused (HTTP 429) with the seconds until a token is back. Buckets
live in memory (a restart refills them) and are checked on the event loop's
thread only, so no lock is needed. Buckets of keys unused for a while are
dropped, so their number stays bounded by the keys active recently.

Why not a library: ``slowapi`` (Starlette's usual rate limiter) keys its limits
in a decorator on each route by a function of the request, before FastAPI's
dependencies run -- that is, before the key is verified, so a made-up key would
get a bucket of its own -- and brings ``limits`` with storage back-ends the
service does not use. The bucket is the dozen lines below, tested on their own
(``tests/test_service_attacks.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class RateLimiter:
    """Token buckets by key.

    Parameters
    ----------
    rate : float
        Tokens per second per key (0: no limit).
    burst : int
        Bucket size: requests a key may send at once after a quiet spell (>= 1).
    clock : callable, optional
        Seconds, monotonic (tests pass a fake clock).
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a positive integer, got {burst!r}")
        self.rate, self.burst, self.clock = float(rate), burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, time of that count)
        self._swept = clock()

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 when allowed, else the seconds until one is available."""
        if self.rate == 0:
            return 0.0
        now = self.clock()
        tokens, then = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens - 1.0, now)
        if now - self._swept > 60.0:
            self._sweep(now)
        return 0.0

    def _sweep(self, now: float) -> None:
        """Forget buckets that are full again (nothing to remember about them)."""
        full = self.burst / self.rate
        self._buckets = {k: (t, s) for k, (t, s) in self._buckets.items() if now - s < full}
        self._swept = now
