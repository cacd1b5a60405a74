"""`redis://host:port/db`: the durable backend.

Keys (identity and id percent-encoded, see `key_path`):
  mship:responses/<identity>/<id>  the snapshot (StoredResponse bytes)
  mship:runs/<identity>/<id>       the run (StoredRun bytes: status, owner, lease, last sequence)
  mship:events/<identity>/<id>     the event log, a Stream whose entry ids are `<sequence>-0`
  mship:runs:leases                sorted set of unfinished leased runs by lease end (the sweep)
  mship:<key>                      plain blobs (model sets)

A response's keys (snapshot, run, events) expire `retention_s` after the last write to any of them:
every write sets the expiry of all three (in its transaction).

Multi-key writes are optimistic transactions: WATCH the run, read it, apply the rule (runs.py),
then MULTI/EXEC every write; a concurrent change retries. Nothing is written before EXEC, and
Redis applies an EXEC whole or not at all, so a crash or an outage never leaves half a write. A
connection lost after EXEC went out leaves it unknown whether it was applied: the retry first
checks for exactly that write (see `_transact`), so it is applied once and reported as done.
Followers block in XREAD on the stream. Every Redis error is StoreUnavailable, and so is a call
that Redis has not answered within `call_timeout_s` (a hung or black-holed Redis): each store call,
its retries and a whole transaction included, ends well within the state client's gRPC deadline,
so the gateway answers a prompt 503, not a DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlparse

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from mship.state.v1 import state_pb2 as pb
from services.state import runs
from services.state.store import (
    Mutation,
    RunWrite,
    Store,
    StoreUnavailable,
    key_path,
    parse_key_path,
    snapshot_bytes,
)

T = TypeVar("T")
NS = "mship:"
LEASES = NS + "runs:leases"
MAX_TRANSACTION_TRIES = 50
# A store call's whole time (retries, a transaction's every attempt): well under the state
# client's 10 s deadline (services/state/client.py), so a hung Redis is UNAVAILABLE, not a deadline.
CALL_TIMEOUT_S = 4.0
SOCKET_TIMEOUT_S = 2.0  # one read or write: a retry still fits in CALL_TIMEOUT_S


def _keys(identity: str, response_id: str) -> tuple[str, str, str]:
    path = key_path(identity, response_id)
    return f"{NS}responses/{path}", f"{NS}runs/{path}", f"{NS}events/{path}"


def _event(entry_id: bytes, fields: dict[bytes, bytes]) -> pb.RunEvent:
    return pb.RunEvent(sequence=int(entry_id.split(b"-")[0]), event_json=fields[b"j"].decode(),
                       terminal=fields.get(b"t") == b"1")


def _connection_lost(error: redis.WatchError) -> bool:
    """The WatchError redis-py raises for a connection lost while watching (maybe after EXEC was
    sent), not for a watched key that changed (EXEC answered nil: nothing was applied)."""
    return isinstance(error.__context__, (redis.ConnectionError, redis.TimeoutError))


async def _holds(pipe: Pipeline, run_data: bytes, events_key: str, write: RunWrite) -> bool:
    """Whether the store holds exactly `write`: its run, byte for byte (its update time included),
    and its events at their sequences."""
    if run_data != write.run.SerializeToString():
        return False
    if not write.events:
        return True
    first, last = write.events[0].sequence, write.events[-1].sequence
    entries = await pipe.xrange(events_key, f"{first}-0", f"{last}-0")
    return [_event(entry_id, fields) for entry_id, fields in entries] == write.events


class RedisStore(Store):
    backend = "redis"

    def __init__(self, url: str, call_timeout_s: float = CALL_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        parsed = urlparse(url)
        self.call_timeout_s = call_timeout_s
        self._socket_timeout = socket_timeout = min(SOCKET_TIMEOUT_S, call_timeout_s)
        # Few, short retries: an outage should be a prompt 503 (with RetryInfo), not a stall.
        self._client = aioredis.Redis(host=parsed.hostname or "127.0.0.1", port=parsed.port or 6379,
                                      db=int((parsed.path or "/0").lstrip("/") or 0),
                                      password=os.environ.get("MSHIP_REDIS_PASSWORD") or None,
                                      socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
                                      retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), retries=3))

    async def _call(self, op: Awaitable[T], blocks_s: float = 0.0) -> T:
        """`op` within call_timeout_s (+ `blocks_s`, the time a blocking read may wait by design).
        A cancelled read drops its connection (redis-py), so nothing stale is read after it."""
        try:
            async with asyncio.timeout(self.call_timeout_s + blocks_s):
                return await op
        except redis.RedisError as e:
            raise StoreUnavailable(f"{type(e).__name__}: {e}") from e
        except TimeoutError:
            raise StoreUnavailable(f"Redis did not answer within {self.call_timeout_s + blocks_s:g} s") from None

    async def _transact(self, watch: list[str], body: Callable[[Pipeline, bool], Awaitable[T]]) -> T:
        """Run `body` (reads in immediate mode, then `pipe.multi()` and queued writes) under WATCH,
        retrying when a watched key changed before EXEC. A body that never calls multi() writes nothing.

        `body(pipe, unsure)`: `unsure` once an earlier attempt lost its connection, so its EXEC may
        have been applied though no reply came (redis-py reports that as a WatchError too). The body
        then first checks whether the store already holds its earlier write, and if so returns
        without writing it again: a retry must not turn the caller's own landed write into a conflict."""
        async def attempt() -> T:
            unsure = False
            async with self._client.pipeline(transaction=True) as pipe:
                for _ in range(MAX_TRANSACTION_TRIES):
                    try:
                        await pipe.watch(*watch)
                        result = await body(pipe, unsure)
                        if pipe.explicit_transaction:
                            await pipe.execute()
                        return result
                    except redis.WatchError as e:
                        unsure = unsure or _connection_lost(e)
                        await pipe.reset()
                raise StoreUnavailable("too many concurrent writers on one run")
        return await self._call(attempt())

    # ---- blobs ----
    async def get(self, key: str) -> bytes | None:
        return await self._call(self._client.get(NS + key))

    async def put(self, key: str, value: bytes) -> None:
        await self._call(self._client.set(NS + key, value))

    async def delete(self, key: str) -> bool:
        return bool(await self._call(self._client.delete(NS + key)))

    async def close(self) -> None:
        await self._client.aclose()

    # ---- responses ----
    @property
    def _ttl_ms(self) -> int | None:
        """The expiry every write gives a response's keys (None: they are kept until deleted)."""
        return max(1, int(self.retention_s * 1000)) if self.retention_s else None

    def _expire_all(self, pipe: Pipeline, keys: tuple[str, ...]) -> None:
        if self._ttl_ms is not None:
            for key in keys:
                pipe.pexpire(key, self._ttl_ms)

    async def put_response(self, response: pb.StoredResponse, create_only: bool = False) -> None:
        snap_key, _, _ = _keys(response.key.identity, response.key.response_id)
        done = await self._call(self._client.set(snap_key, snapshot_bytes(response, self.clock()), nx=create_only,
                                                 px=self._ttl_ms))
        if not done:
            raise runs.already_exists(response.key.response_id)

    async def delete_response(self, identity: str, response_id: str) -> bool:
        async def delete() -> int:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(*_keys(identity, response_id))
                pipe.zrem(LEASES, key_path(identity, response_id))
                deleted, _ = await pipe.execute()
            return deleted
        return await self._call(delete()) > 0

    async def _load(self, identity: str, response_id: str) -> tuple[pb.StoredResponse | None, pb.StoredRun | None]:
        snap_key, run_key, _ = _keys(identity, response_id)
        snapshot, run = await self._call(self._client.mget(snap_key, run_key))
        return (pb.StoredResponse.FromString(snapshot) if snapshot is not None else None,
                pb.StoredRun.FromString(run) if run is not None else None)

    async def _load_run(self, identity: str, response_id: str) -> pb.StoredRun | None:
        data = await self._call(self._client.get(_keys(identity, response_id)[1]))
        return pb.StoredRun.FromString(data) if data is not None else None

    # ---- runs ----
    def _index(self, pipe: Pipeline, identity: str, response_id: str, record: pb.RunStatusRecord) -> None:
        member = key_path(identity, response_id)
        if record.status in runs.ACTIVE and record.owner_expires_at > 0:
            pipe.zadd(LEASES, {member: record.owner_expires_at})
        else:
            pipe.zrem(LEASES, member)

    async def _create_run(self, identity: str, response_id: str, response: bytes, run: pb.StoredRun) -> None:
        snap_key, run_key, events_key = _keys(identity, response_id)
        run_bytes = run.SerializeToString()

        async def body(pipe: Pipeline, unsure: bool) -> None:
            if unsure and await pipe.mget(snap_key, run_key) == [response, run_bytes]:
                return  # this very create landed, its reply lost
            if await pipe.exists(snap_key, run_key):
                raise runs.already_exists(response_id)
            pipe.multi()
            pipe.set(snap_key, response, px=self._ttl_ms)
            pipe.set(run_key, run_bytes, px=self._ttl_ms)
            pipe.delete(events_key)
            self._index(pipe, identity, response_id, run.record)
        await self._transact([snap_key, run_key], body)

    async def _update_run(self, identity: str, response_id: str, mutate: Mutation) -> pb.RunStatusRecord:
        snap_key, run_key, events_key = _keys(identity, response_id)

        queued: list[RunWrite] = []  # what earlier attempts of this call sent to EXEC

        async def body(pipe: Pipeline, unsure: bool) -> pb.RunStatusRecord:
            data = await pipe.get(run_key)
            if data is None:
                raise runs.not_found(identity, response_id)
            if unsure:
                for earlier in queued:
                    if await _holds(pipe, data, events_key, earlier):
                        return earlier.run.record  # it landed, its reply lost: done, not a conflict
            stored = pb.StoredRun.FromString(data)
            write = mutate(stored, self.clock())  # may raise: nothing queued yet
            if write is None:
                return stored.record
            queued.append(write)
            pipe.multi()
            if write.response is not None:
                pipe.set(snap_key, write.response)
            for event in write.events:
                pipe.xadd(events_key, {"j": event.event_json, "t": "1" if event.terminal else "0"},
                          id=f"{event.sequence}-0")
            pipe.set(run_key, write.run.SerializeToString(), px=self._ttl_ms)
            self._expire_all(pipe, (snap_key, events_key))
            self._index(pipe, identity, response_id, write.run.record)
            return write.run.record
        return await self._transact([run_key], body)

    async def _expired_candidates(self, now: float, limit: int) -> list[tuple[str, str]]:
        members = await self._call(self._client.zrangebyscore(LEASES, "-inf", now, start=0, num=limit))
        return [parse_key_path(m.decode()) for m in members]

    # ---- events ----
    async def _events_after(self, identity: str, response_id: str, after: int, limit: int) -> list[pb.RunEvent]:
        entries = await self._call(self._client.xrange(_keys(identity, response_id)[2], f"({after}-0", "+",
                                                       count=limit))
        return [_event(entry_id, fields) for entry_id, fields in entries]

    async def _wait_events(self, identity: str, response_id: str, after: int, timeout_s: float) -> list[pb.RunEvent]:
        events_key = _keys(identity, response_id)[2]
        # Blocks less than a socket read may take (an empty answer only makes the caller re-check).
        block_s = min(timeout_s, self._socket_timeout / 2)
        reply = await self._call(self._client.xread({events_key: f"{after}-0"}, count=256,
                                                    block=max(1, int(block_s * 1000))), blocks_s=block_s)
        return [_event(entry_id, fields) for _, entries in reply or [] for entry_id, fields in entries]
