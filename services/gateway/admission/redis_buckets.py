"""The token buckets in Redis, shared by every gateway replica: one Lua script per decision, so
a draw across replicas is atomic; Redis's own clock (TIME) is the one clock all replicas share.
Keys expire a minute after their last change (a full bucket needs no key)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from services.common.vocabulary import ENV_REDIS_PASSWORD
from services.gateway.admission.buckets import SECONDS_PER_WINDOW, Bucket, Draw

KEY_PREFIX = "mship:rl:"

# KEYS: buckets; ARGV: limit, cost per bucket. Returns {granted, level...} (levels as strings:
# a Lua number would come back truncated to an integer).
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local window = tonumber(ARGV[#ARGV])
local levels, granted = {}, 1
for i = 1, #KEYS do
  local limit, cost = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local held = redis.call('HMGET', KEYS[i], 'l', 't')
  local level = limit
  if held[1] then
    level = math.min(limit, tonumber(held[1]) + math.max(0, now - tonumber(held[2])) * limit / window)
  end
  levels[i] = level
  if level < cost then granted = 0 end
end
local out = {granted}
for i = 1, #KEYS do
  local level = levels[i]
  if granted == 1 then
    level = level - tonumber(ARGV[2 * i])
    redis.call('HSET', KEYS[i], 'l', tostring(level), 't', tostring(now))
    redis.call('EXPIRE', KEYS[i], math.ceil(window) * 2)
  end
  out[i + 1] = tostring(level)
end
return out
"""

# KEYS[1]: bucket; ARGV: limit, delta, window.
ADJUST = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local limit, delta, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 'l', 't')
local level = limit
if held[1] then
  level = math.min(limit, tonumber(held[1]) + math.max(0, now - tonumber(held[2])) * limit / window)
end
level = math.min(limit, level + delta)
redis.call('HSET', KEYS[1], 'l', tostring(level), 't', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(window) * 2)
return 1
"""


class RedisBuckets:
    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        parsed = urlparse(url)
        self._client = aioredis.Redis(host=parsed.hostname or "127.0.0.1", port=parsed.port or 6379,
                                      db=int((parsed.path or "/0").lstrip("/") or 0),
                                      password=os.environ.get(ENV_REDIS_PASSWORD) or None,
                                      socket_timeout=2, socket_connect_timeout=2)
        self._take = self._client.register_script(TAKE)
        self._adjust = self._client.register_script(ADJUST)

    async def take(self, buckets: list[Bucket]) -> tuple[bool, list[Draw]]:
        args: list[float] = [v for b in buckets for v in (b.limit, b.cost)]
        reply = await self._take(keys=[KEY_PREFIX + b.key for b in buckets], args=[*args, SECONDS_PER_WINDOW])
        return int(reply[0]) == 1, [Draw(b.limit, float(level), b.cost)
                                    for level, b in zip(reply[1:], buckets, strict=True)]

    async def adjust(self, key: str, limit: int, delta: float) -> None:
        await self._adjust(keys=[KEY_PREFIX + key], args=[limit, delta, SECONDS_PER_WINDOW])

    async def close(self) -> None:
        await self._client.aclose()
