"""State backends behind one interface: `memory://` (embedded default) and `redis://host:port/db`.

The Redis password comes from MSHIP_REDIS_PASSWORD, never from the URL that is passed around.
Values are serialized protobuf messages; keys are namespaced under `mship:`.
"""

from __future__ import annotations

import abc
import os
from urllib.parse import urlparse

import grpc

from services.common.errors import Reason, ServiceError


class StoreUnavailable(ServiceError):
    def __init__(self, detail: str) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, Reason.STORE_UNAVAILABLE,
                         f"the state store is unavailable: {detail}", retry_after_s=1.0)


class Store(abc.ABC):
    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None: ...

    @abc.abstractmethod
    async def delete(self, key: str) -> bool: ...

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing to close
        pass


class MemoryStore(Store):
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self._data[key] = value

    async def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None


class RedisStore(Store):
    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        parsed = urlparse(url)
        self._client = redis.Redis(host=parsed.hostname or "127.0.0.1", port=parsed.port or 6379,
                                   db=int((parsed.path or "/0").lstrip("/") or 0),
                                   password=os.environ.get("MSHIP_REDIS_PASSWORD") or None,
                                   socket_timeout=5, socket_connect_timeout=2)

    async def _call(self, op, *args):
        import redis

        try:
            return await op(*args)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise StoreUnavailable(str(e)) from e

    async def get(self, key: str) -> bytes | None:
        return await self._call(self._client.get, "mship:" + key)

    async def put(self, key: str, value: bytes) -> None:
        await self._call(self._client.set, "mship:" + key, value)

    async def delete(self, key: str) -> bool:
        return bool(await self._call(self._client.delete, "mship:" + key))

    async def close(self) -> None:
        await self._client.aclose()


def open_store(url: str) -> Store:
    scheme = urlparse(url).scheme
    if scheme == "memory":
        return MemoryStore()
    if scheme == "redis":
        if urlparse(url).password:
            raise ValueError("put the Redis password in MSHIP_REDIS_PASSWORD, not in the URL")
        return RedisStore(url)
    raise ValueError(f"unknown state store {url!r}: use memory:// or redis://host:port/db")
