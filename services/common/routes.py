"""A subscriber's view of the routing table (gateway, Python client).

A watcher task keeps a WatchRouting stream open (reconnecting with jittered backoff and its last
version, keeping the last snapshot meanwhile: a coordinator restart never blanks the routes).
The table keeps one channel per worker endpoint and a circuit breaker per endpoint (an endpoint
that keeps failing leaves the rotation for a cool-down and comes back once a health probe says it
serves: services/common/breaker.py); which endpoint a call tries first is its `ReplicaPicker`'s
choice (services/common/picker.py; prefix affinity bounded by load, or least outstanding requests).

A model autoscaled to zero has a route with no endpoints: a call to it asks the coordinator for a
replica (`RequestReplica`, through the watcher) and waits, up to a bound, for a snapshot that has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from mship.worker.v1 import worker_pb2_grpc
from services.common.breaker import EndpointBreaker
from services.common.channels import aio_channel
from services.common.delivery import DeliveryReader
from services.common.picker import LeastOutstanding, ReplicaPicker

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 2.0
ENV_COLD_START_TIMEOUT_S = "MSHIP_COLD_START_TIMEOUT_S"
COLD_START_TIMEOUT_S = 120.0  # a request to a model at zero replicas waits this long for one
REASK_S = 10.0  # a cold start still waiting asks again (the coordinator may have restarted)
RETIRED_CHANNEL_MAX_S = 3600.0  # how long calls in flight may go on on a replica that left the routes
WATCH_SILENCE_S = 20.0  # a routing watch that hears nothing this long is dead (coordinator keepalive: 5 s)
# A call's own error can come a moment before its channel drops the broken connection: a call made
# again on that replica in that moment goes out on the dead connection. It waits (this at most).
LET_GO_WAIT_S = 0.5
REFRESH_WAIT_S = 1.0  # a call whose replicas all failed waits this long for a newer snapshot to try
MAX_MESSAGE_BYTES = 64 * 2**20  # a gRPC message either way, as the worker's server takes them
# A replica that comes back on its address is reconnected within ~2 s, not after gRPC's default
# backoff of up to 120 s (the breaker's probe waits for that connection).
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 20_000), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 2000)]


@dataclass
class Endpoint:
    address: str
    replica_id: str
    stub: worker_pb2_grpc.WorkerStub
    outstanding: int = 0  # calls in flight: `started()` and `ended()` count them
    delivery: DeliveryReader = field(init=False)  # the stream its Infer calls' deltas come on
    idle: asyncio.Event | None = None  # set once no call is in flight, after it left the routes

    def __post_init__(self) -> None:
        self.delivery = DeliveryReader(self.stub)

    def started(self) -> None:
        self.outstanding += 1

    def ended(self) -> None:
        self.outstanding -= 1
        if self.idle is not None and self.outstanding == 0:
            self.idle.set()


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
    scale_to_zero: bool = False  # no endpoints may be normal: a call waits for a cold start
    accepts_images: bool | None = None  # a vision model; None: not known yet (the worker decides)


class RouteTable:
    """Routes from the latest snapshot, with one channel per worker endpoint (reused across snapshots)."""

    def __init__(self, picker: ReplicaPicker | None = None, token: str | None = None,
                 breaker: EndpointBreaker | None = None) -> None:
        self.token = token  # None: this node's platform token
        self.picker: ReplicaPicker = picker or LeastOutstanding()
        self.breaker = breaker or EndpointBreaker()
        self._probes: set[asyncio.Task] = set()  # health probes, replica requests, channels left to close
        self.version = 0
        self.routes: dict[str, Route] = {}
        self.pending: list[str] = []
        self.unhealthy: list[str] = []  # routed, but every replica fails its health check
        self.received = asyncio.Event()  # a first snapshot arrived
        self._applied = asyncio.Event()  # set (and replaced) by every snapshot
        self._channels: dict[str, tuple[grpc.aio.Channel, Endpoint]] = {}
        # Asks the coordinator for a replica of a model at zero (the watcher sets it; None: cannot).
        self.request_replica: Callable[[str], Awaitable[None]] | None = None
        self._asked: dict[str, float] = {}  # model -> when a replica was last asked for (loop time)
        self.start_refused: dict[str, str] = {}  # model -> why the coordinator starts none (until asked again)
        self.cold_start_timeout_s = float(os.environ.get(ENV_COLD_START_TIMEOUT_S, COLD_START_TIMEOUT_S))
        self.refresh_wait_s = REFRESH_WAIT_S

    def apply(self, snapshot: cpb.RoutingSnapshot) -> None:
        routes, live = {}, set()
        for model in snapshot.models:
            route = Route(model.name, model.version, model.max_model_len, model.usecase,
                          embedding_dimension=model.embedding_dimension,
                          requests_per_minute=model.rate_limits.requests_per_minute,
                          tokens_per_minute=model.rate_limits.tokens_per_minute, scale_to_zero=model.scale_to_zero,
                          accepts_images=model.accepts_images if model.HasField("accepts_images") else None)
            for replica in model.replicas:
                address = f"{replica.endpoint.host}:{replica.endpoint.port}"
                live.add(address)
                if address not in self._channels:
                    channel = aio_channel(address, CHANNEL_OPTIONS, self.token)
                    self._channels[address] = (channel, Endpoint(address, replica.replica_id,
                                                                 worker_pb2_grpc.WorkerStub(channel)))
                route.endpoints.append(self._channels[address][1])
            routes[model.name] = route
        for address in set(self._channels) - live:  # replicas that left: their calls in flight go on
            channel, endpoint = self._channels.pop(address)
            endpoint.delivery.retire()
            task = asyncio.get_running_loop().create_task(self._close_when_idle(channel, endpoint))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)
        self.routes, self.pending, self.version = routes, list(snapshot.pending), snapshot.version
        self.unhealthy = list(snapshot.unhealthy)
        self.breaker.keep_only(live)
        self.received.set()
        applied, self._applied = self._applied, asyncio.Event()
        applied.set()

    def candidates(self, model: str, affinity: str | None = None) -> list[Endpoint]:
        """Endpoints of `model`, best first, in the picker's order (`affinity`: the call's prefix key)."""
        route = self.routes.get(model)
        if route is None:
            return []
        for address in self.breaker.due_for_probe():
            self._probe(address)
        return self.picker.order(route.endpoints, self.breaker.excluded(), affinity)

    async def wait_newer(self, version: int, timeout_s: float) -> bool:
        """Whether a snapshot newer than `version` is applied, waiting up to `timeout_s` for one."""
        with contextlib.suppress(TimeoutError):  # asyncio.timeout: 3.11's wait_for can lose a cancel
            async with asyncio.timeout(timeout_s):
                while self.version == version:
                    await self._applied.wait()
        return self.version != version

    async def cold_start(self, model: str) -> list[Endpoint]:
        """Endpoints of a model at zero replicas, once one serves: asks the coordinator for a replica
        (once per model every REASK_S, however many calls wait: again only if a start got lost) and
        waits for a snapshot that routes to one; [] after `cold_start_timeout_s`, or at once when the
        coordinator said none will start (`refuse_start`; it is asked again after REASK_S)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cold_start_timeout_s
        while not (endpoints := self.candidates(model)):
            route = self.routes.get(model)
            if route is None or not route.scale_to_zero or loop.time() >= deadline:
                return []
            self._ask_for_replica(model)
            if model in self.start_refused:
                return []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(REASK_S, deadline - loop.time())):
                    await self._applied.wait()
        return endpoints

    def _ask_for_replica(self, model: str) -> None:
        now = asyncio.get_running_loop().time()
        if self.request_replica is None or now - self._asked.get(model, -REASK_S) < REASK_S:
            return
        self._asked[model] = now
        self.start_refused.pop(model, None)
        task = asyncio.get_running_loop().create_task(self.request_replica(model))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def asks_again_in(self, model: str) -> float:
        """Seconds (whole, at least 1) before a cold start of `model` asks the coordinator again."""
        asked_at = self._asked.get(model, -REASK_S)
        return float(max(1, math.ceil(REASK_S - (asyncio.get_running_loop().time() - asked_at))))

    def refuse_start(self, model: str, reason: str) -> None:
        """The coordinator will start no replica of `model` (`reason`): its cold starts end now."""
        self.start_refused[model] = reason
        applied, self._applied = self._applied, asyncio.Event()
        applied.set()

    def mark_bad(self, endpoint: Endpoint, started_at: float | None = None) -> None:
        """A call on `endpoint`, made at `started_at` (monotonic), failed (unreachable, or its stream
        broke): one failure for its breaker, unless an earlier one already counted its connection's."""
        self.breaker.failure(endpoint.address, started_at)

    def mark_ok(self, endpoint: Endpoint) -> None:
        self.breaker.success(endpoint.address)

    def _probe(self, address: str) -> None:
        """Half-open: the worker's health check decides whether the endpoint takes traffic again."""
        held = self._channels.get(address)
        if held is None:
            self.breaker.success(address)  # gone from the routes: nothing to keep out
            return

        async def probe() -> None:
            try:
                reply = await health_pb2_grpc.HealthStub(held[0]).Check(
                    health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S, wait_for_ready=True)
                serving = reply.status == health_pb2.HealthCheckResponse.SERVING
            except (grpc.aio.AioRpcError, grpc.aio.UsageError):
                serving = False
            self.breaker.probed(address, serving)
        task = asyncio.get_running_loop().create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def let_go(self, endpoint: Endpoint) -> None:
        """Before a call is made again on `endpoint` after its connection broke: until its channel
        no longer holds that connection (it leaves READY), at most LET_GO_WAIT_S."""
        held = self._channels.get(endpoint.address)
        if held is None or held[1] is not endpoint:
            return
        channel = held[0]
        if channel.get_state() == grpc.ChannelConnectivity.READY:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LET_GO_WAIT_S):
                    await channel.wait_for_state_change(grpc.ChannelConnectivity.READY)

    async def _close_when_idle(self, channel: grpc.aio.Channel, endpoint: Endpoint) -> None:
        """A replica that left the routes may still be serving (a cut-over's drain, a heartbeat
        missed): its channel closes once its calls ended, not under them (gRPC's close grace cancels
        whatever is left), and at the latest after RETIRED_CHANNEL_MAX_S."""
        endpoint.idle = asyncio.Event()
        try:
            if endpoint.outstanding > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETIRED_CHANNEL_MAX_S):
                        await endpoint.idle.wait()
        finally:
            await channel.close()

    async def close(self) -> None:
        for task in list(self._probes):
            task.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        for channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()


class RoutingWatcher:
    def __init__(self, coordinator: str, table: RouteTable, subscriber_id: str) -> None:
        self.coordinator = coordinator
        self.table = table
        self.subscriber_id = subscriber_id
        self.last_error: grpc.aio.AioRpcError | None = None  # why the watch last broke (callers report it)
        self.broke = asyncio.Event()  # set each time the watch breaks with an error (last_error); callers clear it
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.table.request_replica = self._request_replica
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _request_replica(self, model: str) -> None:
        try:
            async with aio_channel(self.coordinator, token=self.table.token) as channel:
                reply = await coordinator_pb2_grpc.CoordinatorStub(channel).RequestReplica(
                    cpb.RequestReplicaRequest(model=model), timeout=10)
        except grpc.aio.AioRpcError as e:  # the caller's wait ends on its deadline
            log.warning("asking for a replica of %s failed: %s", model, e.code().name)
            return
        if not reply.starting:
            log.info("no replica of %s will start: %s", model, reply.reason)
            self.table.refuse_start(model, reply.reason)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            async with aio_channel(self.coordinator, token=self.table.token) as channel:
                try:
                    async for update in self._watch(coordinator_pb2_grpc.CoordinatorStub(channel)):
                        backoff = 0.1
                        if update.HasField("snapshot"):
                            self.table.apply(update.snapshot)
                except grpc.aio.AioRpcError as e:
                    self.last_error = e
                    self.broke.set()
                    log.info("routing watch broke (%s); keeping version %d", e.code().name, self.table.version)
                except TimeoutError:  # a new channel: the old one's connection is dead without knowing it
                    log.warning("routing watch silent for %.0f s; watching again on a new connection, "
                                "keeping version %d", WATCH_SILENCE_S, self.table.version)
            await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, 2.0)

    async def _watch(self, stub: coordinator_pb2_grpc.CoordinatorStub) -> AsyncIterator[cpb.RoutingUpdate]:
        """The watch's updates; TimeoutError once it is silent for WATCH_SILENCE_S. The coordinator
        sends at least a keepalive every few seconds, so a silent watch is on a connection that died
        without a reset (a host lost, a partition, a dropped NAT entry), which gRPC does not notice."""
        call = stub.WatchRouting(cpb.WatchRoutingRequest(known_version=self.table.version,
                                                         subscriber_id=self.subscriber_id))
        try:
            while True:
                async with asyncio.timeout(WATCH_SILENCE_S):
                    update = await call.read()
                if update is grpc.aio.EOF:
                    return
                yield update
        finally:
            call.cancel()

    def ended(self) -> str | None:
        """Why the watch ended for good (it retries every failure it expects: only a bug ends it);
        None while it runs, or before it started."""
        task = self._task
        if task is None or not task.done():
            return None
        return "cancelled" if task.cancelled() else repr(task.exception())

    async def stop(self) -> None:
        """Ends the watch and closes the table. A watch that had already ended with an error said so
        (`ended()`: the replica's health check): stopping closes the table all the same, and does
        not raise it again into its caller's stop."""
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled() and (error := task.exception()) is not None:
                log.warning("the routing watch had ended: %r", error)
        await self.table.close()
