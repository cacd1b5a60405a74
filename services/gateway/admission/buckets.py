"""Token buckets, the rate-limit arithmetic: a bucket holds up to `limit` (the per-minute limit)
and refills continuously at limit/60 a second, so a burst of `limit` is allowed and then one
more each 60/limit seconds; "the window resets" as the bucket refills.

`take` draws from several buckets all or nothing (a request refused for tokens spends no request);
`adjust` puts back (or charges) the difference between a reservation and the real usage.
`MemoryBuckets` serves one gateway replica; `RedisBuckets` (redis_buckets.py) shares the same
arithmetic between every replica. Levels are floats; a bucket may go below zero when the real
usage exceeded the reservation (the debt is paid back by the refill).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

SECONDS_PER_WINDOW = 60.0
PRUNE_AT = 10_000  # keys held in memory before full buckets are forgotten (a full bucket = no entry)


@dataclass(frozen=True)
class Bucket:
    key: str
    limit: int
    cost: int


@dataclass(frozen=True)
class Draw:
    """One bucket after a `take`: what the x-ratelimit-* headers report."""

    limit: int
    level: float          # after the draw when granted, else as it stands
    cost: int

    @property
    def rate(self) -> float:
        return self.limit / SECONDS_PER_WINDOW

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset_s(self) -> float:
        """Until the bucket is full again."""
        return max(0.0, (self.limit - self.level) / self.rate)

    @property
    def retry_after_s(self) -> float:
        """Until this draw's cost is there (0 when it is now)."""
        return max(0.0, (self.cost - self.level) / self.rate)


def refill(level: float, elapsed_s: float, limit: int) -> float:
    return min(float(limit), level + max(0.0, elapsed_s) * limit / SECONDS_PER_WINDOW)


class BucketStore(Protocol):
    async def take(self, buckets: list[Bucket]) -> tuple[bool, list[Draw]]: ...
    async def adjust(self, key: str, limit: int, delta: float) -> None: ...


class MemoryBuckets:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._state: dict[str, tuple[float, float, int]] = {}  # key -> (level, at, limit)
        self._prune_at = PRUNE_AT

    def _level(self, key: str, limit: int, now: float) -> float:
        held = self._state.get(key)
        return float(limit) if held is None else refill(held[0], now - held[1], limit)

    async def take(self, buckets: list[Bucket]) -> tuple[bool, list[Draw]]:
        now = self._clock()
        levels = [self._level(b.key, b.limit, now) for b in buckets]
        granted = all(level >= b.cost for level, b in zip(levels, buckets, strict=True))
        if granted:
            levels = [level - b.cost for level, b in zip(levels, buckets, strict=True)]
            for level, b in zip(levels, buckets, strict=True):
                self._state[b.key] = (level, now, b.limit)
            if len(self._state) > self._prune_at:
                self._prune(now)
        return granted, [Draw(b.limit, level, b.cost) for level, b in zip(levels, buckets, strict=True)]

    async def adjust(self, key: str, limit: int, delta: float) -> None:
        now = self._clock()
        self._state[key] = (min(float(limit), self._level(key, limit, now) + delta), now, limit)

    def _prune(self, now: float) -> None:
        """Forget the buckets the refill has made full again: a missing key is a full bucket."""
        for key, (level, at, limit) in list(self._state.items()):
            if refill(level, now - at, limit) >= limit:
                del self._state[key]
        # the next look when the live keys have doubled: a scan per take once many identities are
        # live (one per client address when anonymous) would be quadratic; this is amortized O(1)
        self._prune_at = max(PRUNE_AT, 2 * len(self._state))
