"""What the Store contract suite (tests/unit/test_state_store.py) runs against: the memory and Redis
backends, and the gRPC state service fronting either (a `StateClient` talking to the real
StateServicer on a real grpc.aio server), all behind the Store interface and a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from mship.state.v1 import state_pb2 as pb
from services.common.errors import Reason, ServiceError
from services.state import client as sc
from services.state.memory_store import MemoryStore
from services.state.redis_store import RedisStore
from services.state.server import serve_store
from services.state.store import Store

T = TypeVar("T")
FOLLOW_POLL_S = 0.05
# Redis and the service start servers: the integration tier, like every Redis test.
BACKENDS = [pytest.param("memory"), pytest.param("redis", marks=pytest.mark.integration),
            pytest.param("service:memory", marks=pytest.mark.integration),
            pytest.param("service:redis", marks=pytest.mark.integration)]
# The backends whose followers are woken by a deletion (a Redis XREAD is not: it polls).
WAKE_ON_DELETE = [p for p in BACKENDS if p.values[0] in ("memory", "service:memory")]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def as_service_error(err: sc.StateError) -> ServiceError:
    """A state client's error as the store raised it on the other side of the wire."""
    d = err.details
    return ServiceError(d.code, Reason.Value(d.reason) if d.reason else 0, d.message,
                        field_violations=d.field_violations, retry_after_s=d.retry_after_s, metadata=d.metadata)


class ServiceStore:
    """The Store interface over a StateClient: what the service promises is what a Store promises."""

    def __init__(self, client: sc.StateClient) -> None:
        self.client = client

    async def _call(self, op: Awaitable[T]) -> T:
        try:
            return await op
        except sc.StateError as e:
            raise as_service_error(e) from e

    async def _or_none(self, op: Awaitable[T]) -> T | None:
        try:
            return await op
        except sc.NotFound:
            return None

    async def put_response(self, response: pb.StoredResponse, create_only: bool = False) -> None:
        await self._call(self.client.put_response(response, create_only))

    async def get_response(self, identity: str, response_id: str) -> pb.StoredResponse | None:
        return await self._or_none(self.client.get_response(identity, response_id))

    async def delete_response(self, identity: str, response_id: str) -> bool:
        return await self._call(self.client.delete_response(identity, response_id))

    async def create_run(self, response: pb.StoredResponse, status: int = pb.RUN_STATUS_QUEUED, owner: str = "",
                         lease_s: float = 0.0, failure_event_json: str = "") -> pb.RunStatusRecord:
        return await self._call(self.client.create_run(response, owner, lease_s, status, failure_event_json))

    async def get_run(self, identity: str, response_id: str) -> pb.RunStatusRecord | None:
        return await self._or_none(self.client.get_run_status(identity, response_id))

    async def set_run_status(self, identity: str, response_id: str, status: int, expected: Iterable[int] = (),
                             owner: str = "", lease_s: float = 0.0) -> pb.RunStatusRecord:
        return await self._call(self.client.set_run_status(identity, response_id, status, expected, owner, lease_s))

    async def renew_run(self, identity: str, response_id: str, owner: str, lease_s: float) -> pb.RunStatusRecord:
        return await self._call(self.client.renew_run(identity, response_id, owner, lease_s))

    async def finish_run(self, identity: str, response_id: str, status: int, expected: Iterable[int] = (),
                         owner: str = "", response: pb.StoredResponse | None = None,
                         events: Sequence[pb.RunEvent] = ()) -> pb.RunStatusRecord:
        return await self._call(self.client.finish_run(identity, response_id, status, expected=expected, owner=owner,
                                                       response=response, events=events))

    async def expire_runs(self, limit: int = 100) -> list[pb.RunStatusRecord]:
        return await self._call(self.client.expire_runs(limit))

    async def append_events(self, identity: str, response_id: str, events: Sequence[pb.RunEvent],
                            owner: str = "") -> int:
        return await self._call(self.client.append_events(identity, response_id, events, owner))

    async def read_events(self, identity: str, response_id: str, after: int = 0,
                          follow: bool = False) -> AsyncIterator[pb.RunEvent]:
        try:
            async for event in self.client.read_events(identity, response_id, after, follow):
                yield event
        except sc.StateError as e:
            raise as_service_error(e) from e


@dataclass
class Backend:
    store: Any  # Store or ServiceStore: the contract's interface
    inner: Store  # the backend that holds the data (behind the service, for a service)
    clock: Clock


@contextlib.asynccontextmanager
async def open_backend(kind: str, redis_url: Callable[[], str]) -> AsyncIterator[Backend]:
    """`kind`: memory, redis, service:memory or service:redis; `redis_url` gives an empty Redis."""
    served, _, name = kind.rpartition(":")
    clock = Clock()
    inner: Store = (MemoryStore(clock=clock, follow_poll_s=FOLLOW_POLL_S) if name == "memory"
                    else RedisStore(redis_url(), clock=clock, follow_poll_s=FOLLOW_POLL_S))
    if not served:
        try:
            yield Backend(inner, inner, clock)
        finally:
            await inner.close()
        return
    server, port = await serve_store(inner, "127.0.0.1", 0, sweep_interval_s=None)  # closes `inner` on stop
    client = sc.StateClient(f"127.0.0.1:{port}")
    try:
        yield Backend(ServiceStore(client), inner, clock)
    finally:
        await client.close()
        await server.stop(0)


def watch_waits(store: Store) -> asyncio.Event:
    """Set once a follower of `store` has read everything and waits for more."""
    waiting = asyncio.Event()
    wait_events = store._wait_events

    async def spy(*args: Any, **kwargs: Any) -> list[pb.RunEvent]:
        waiting.set()
        return await wait_events(*args, **kwargs)

    store._wait_events = spy  # type: ignore[method-assign]
    return waiting


def snap(identity: str, rid: str, text: str = "", conversation: str = "[]", parent: str = "",
         items: tuple[str, ...] = ()) -> pb.StoredResponse:
    return pb.StoredResponse(key=pb.ResponseKey(identity=identity, response_id=rid), previous_response_id=parent,
                             response_json=f'{{"id": "{rid}", "text": "{text}"}}', conversation_json=conversation,
                             input_items=[pb.InputItem(id=i, item_json=f'{{"id": "{i}"}}') for i in items])


def ev(seq: int, text: str = "", terminal: bool = False) -> pb.RunEvent:
    return pb.RunEvent(sequence=seq, event_json=text or f'{{"n": {seq}}}', terminal=terminal)
