"""Bandwidth caps: token buckets shared between the workers (per node, and all nodes together)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

BURST_S = 0.25  # a bucket holds at most this many seconds of its rate


class Bucket:
    """A token bucket of `rate_bps` bytes per second; `take` blocks until the bytes are allowed."""

    def __init__(self, rate_bps: float) -> None:
        if rate_bps <= 0:
            raise ValueError("rate must be positive")
        self.rate_bps = rate_bps
        self.capacity = max(rate_bps * BURST_S, 64 * 1024)
        self._tokens = self.capacity
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def _wait_s(self, count: int) -> float:
        """Spend `count` tokens (going into debt); how long the caller must wait for the debt."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate_bps)
            self._stamp = now
            self._tokens -= count
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bps


class Limiter:
    """The buckets one transfer passes through (its node's and the total); none: unlimited."""

    def __init__(self, buckets: Sequence[Bucket] = (), cancel: threading.Event | None = None):
        self.buckets = tuple(buckets)
        self.cancel = cancel or threading.Event()

    def take(self, count: int) -> None:
        """Wait until `count` bytes may move (returns early once cancelled)."""
        wait = max((b._wait_s(count) for b in self.buckets), default=0.0)
        if wait > 0:
            self.cancel.wait(wait)


def parse_rate(text: str) -> float:
    """`50M` -> 50e6 bytes/s; suffixes k, M, G (powers of 1000) and Ki, Mi, Gi; `B`/`/s` allowed."""
    raw = text.strip().removesuffix("/s").removesuffix("B").removesuffix("b")
    units = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "Ki": 1024, "Mi": 2**20, "Gi": 2**30}
    for suffix in sorted(units, key=len, reverse=True):
        if suffix and raw.endswith(suffix):
            number, scale = raw[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = raw, 1
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"not a rate: {text!r} (write e.g. 50M, 800k, 1G)") from None
    if not value > 0:
        raise ValueError(f"rate must be positive: {text!r}")
    return value
