"""Opening a state store by URL: `memory://` (embedded default) or `redis://host:port/db`.

The Redis password comes from MSHIP_REDIS_PASSWORD, never from the URL that is passed around.
How long stored responses are kept comes from MSHIP_STATE_RETENTION_S (seconds after a response's
last write; default 30 days; 0 keeps them until deleted).
Backends are imported only when chosen: a memory:// deployment never imports the Redis client.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from services.common.vocabulary import ENV_STATE_RETENTION_S
from services.state.store import DEFAULT_RETENTION_S, Store


def retention_from_env() -> float:
    value = os.environ.get(ENV_STATE_RETENTION_S, "").strip()
    if not value:
        return DEFAULT_RETENTION_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{ENV_STATE_RETENTION_S}={value!r}: give seconds (0: keep stored responses until deleted)")
    return seconds


def open_store(url: str, **kwargs: Any) -> Store:
    kwargs.setdefault("retention_s", retention_from_env())
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
