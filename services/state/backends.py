"""Opening a state store by URL: `memory://` (embedded default) or `redis://host:port/db`.

The Redis password comes from MSHIP_REDIS_PASSWORD, never from the URL that is passed around.
How long stored responses are kept comes from MSHIP_STATE_RETENTION_S (seconds after a response's
last write; default 30 days; 0 keeps them until deleted).
Backends are imported only when chosen: a memory:// deployment never imports the Redis client.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from services.common.vocabulary import state_retention_s
from services.state.store import Store


def open_store(url: str, **kwargs: Any) -> Store:
    kwargs.setdefault("retention_s", state_retention_s())
    parsed = urlparse(url)
    if parsed.scheme == "memory":
        from services.state.memory_store import MemoryStore
        return MemoryStore(**kwargs)
    if parsed.scheme == "redis":
        if parsed.password:
            raise ValueError("put the Redis password in MSHIP_REDIS_PASSWORD, not in the URL")
        from services.state.redis_store import RedisStore
        return RedisStore(url, **kwargs)
    raise ValueError(f"unknown state store {url!r}: use memory:// or redis://host:port/db")
