"""A subscriber's view of the routing table (gateway, Python client).

A watcher task keeps a WatchRouting stream open (reconnecting with jittered backoff and its last
version, keeping the last snapshot meanwhile: a coordinator restart never blanks the routes).
The table keeps one channel per worker endpoint and remembers endpoints that failed to connect
until the next snapshot; which endpoint a call tries first is its `ReplicaPicker`'s choice
(services/common/picker.py; least outstanding requests by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from mship.worker.v1 import worker_pb2_grpc
from services.common.channels import aio_channel
from services.common.picker import LeastOutstanding, ReplicaPicker

log = logging.getLogger(__name__)
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 20_000), ("grpc.max_receive_message_length", 64 * 2**20)]


@dataclass
class Endpoint:
    address: str
    replica_id: str
    stub: worker_pb2_grpc.WorkerStub
    outstanding: int = 0


@dataclass
class Route:
    name: str
    version: str
    max_model_len: int
    usecase: int
    endpoints: list[Endpoint] = field(default_factory=list)
    embedding_dimension: int = 0  # embed models: the length of a vector
    requests_per_minute: int = 0  # the model set's rate_limits, per identity (0: unlimited)
    tokens_per_minute: int = 0


class RouteTable:
    """Routes from the latest snapshot, with one channel per worker endpoint (reused across snapshots)."""

    def __init__(self, picker: ReplicaPicker | None = None, token: str | None = None) -> None:
        self.token = token  # None: this node's platform token
        self.picker: ReplicaPicker = picker or LeastOutstanding()
        self.version = 0
        self.routes: dict[str, Route] = {}
        self.pending: list[str] = []
        self.received = asyncio.Event()  # a first snapshot arrived
        self._channels: dict[str, tuple[grpc.aio.Channel, Endpoint]] = {}
        self._bad: set[str] = set()

    def apply(self, snapshot: cpb.RoutingSnapshot) -> None:
        routes, live = {}, set()
        for model in snapshot.models:
            route = Route(model.name, model.version, model.max_model_len, model.usecase,
                          embedding_dimension=model.embedding_dimension,
                          requests_per_minute=model.rate_limits.requests_per_minute,
                          tokens_per_minute=model.rate_limits.tokens_per_minute)
            for replica in model.replicas:
                address = f"{replica.endpoint.host}:{replica.endpoint.port}"
                live.add(address)
                if address not in self._channels:
                    channel = aio_channel(address, CHANNEL_OPTIONS, self.token)
                    self._channels[address] = (channel, Endpoint(address, replica.replica_id,
                                                                 worker_pb2_grpc.WorkerStub(channel)))
                route.endpoints.append(self._channels[address][1])
            routes[model.name] = route
        for address in set(self._channels) - live:  # replicas that left: close their channels
            channel, _ = self._channels.pop(address)
            asyncio.get_running_loop().create_task(channel.close(grace=30))
        self.routes, self.pending, self.version = routes, list(snapshot.pending), snapshot.version
        self._bad.clear()
        self.received.set()

    def candidates(self, model: str) -> list[Endpoint]:
        """Endpoints of `model`, best first, in the picker's order."""
        route = self.routes.get(model)
        if route is None:
            return []
        return self.picker.order(route.endpoints, self._bad)

    def mark_bad(self, endpoint: Endpoint) -> None:
        """`endpoint` could not be reached: pickers skip it until the next snapshot."""
        self._bad.add(endpoint.address)

    async def close(self) -> None:
        for channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()


class RoutingWatcher:
    def __init__(self, coordinator: str, table: RouteTable, subscriber_id: str) -> None:
        self.coordinator = coordinator
        self.table = table
        self.subscriber_id = subscriber_id
        self.last_error: grpc.aio.AioRpcError | None = None  # why the watch last broke (callers report it)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        backoff = 0.1
        async with aio_channel(self.coordinator, token=self.table.token) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            while True:
                try:
                    async for update in self._watch(stub):
                        backoff = 0.1
                        if update.HasField("snapshot"):
                            self.table.apply(update.snapshot)
                except grpc.aio.AioRpcError as e:
                    self.last_error = e
                    log.info("routing watch broke (%s); keeping version %d", e.code().name, self.table.version)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, 2.0)

    def _watch(self, stub: coordinator_pb2_grpc.CoordinatorStub) -> AsyncIterator[cpb.RoutingUpdate]:
        return stub.WatchRouting(cpb.WatchRoutingRequest(known_version=self.table.version,
                                                         subscriber_id=self.subscriber_id))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.table.close()
