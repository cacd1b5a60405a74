"""The replica registry: the coordinator's authoritative record of live worker replicas and of
the version each model routes to, from which it makes the versioned routing snapshots that
gateways subscribe to (their view of those is `services.common.routes.RouteTable`).

Workers register and heartbeat; one that misses heartbeats leaves the registry, one whose engine
fails its health check stays but takes no traffic (`unhealthy`) until Serve replaces it. Every change bumps
the version and wakes the watchers (a compact push protocol in the spirit of Serve's long_poll).
Versions start from the wall clock in milliseconds, so a restarted coordinator's versions are
always newer than anything a subscriber holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.common.limits import replica_limits, scales_to_zero
from services.coordinator import metrics


@dataclass
class ActiveModel:
    version: str
    usecase: int
    max_model_len: int = 0
    rate_limits: common_pb2.RateLimits = field(default_factory=common_pb2.RateLimits)
    limits: common_pb2.ReplicaLimits = field(default_factory=lambda: replica_limits(None))
    scale_to_zero: bool = False  # autoscaled with min_replicas 0: no replica is not "pending"

    @classmethod
    def of(cls, spec: common_pb2.ModelSpec, version: str) -> ActiveModel:
        return cls(version, spec.usecase, spec.max_model_len, spec.rate_limits, replica_limits(spec),
                   scales_to_zero(spec))


@dataclass
class Replica:
    info: pb.ReplicaInfo
    last_seen: float
    load: pb.HeartbeatRequest = field(default_factory=pb.HeartbeatRequest)  # the latest heartbeat

    @property
    def healthy(self) -> bool:
        return not self.load.unhealthy


class ReplicaRegistry:
    def __init__(self, heartbeat_timeout_s: float = 3.0) -> None:
        self.version = int(time.time() * 1000)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.replicas: dict[str, Replica] = {}
        self.active: dict[str, ActiveModel] = {}  # model name -> the version that takes traffic
        # Models asked for (the start set, the committed set at a start) not routed yet: pending from
        # the first snapshot, so readiness is never claimed before what the operator asked for serves.
        self.expected: set[str] = set()
        self._changed = asyncio.Condition()
        self._exported: set[str] = set()  # models whose replica gauges were set
        # (model, version) -> accepts images, as its replicas said: kept while it scales to zero
        self._vision: dict[tuple[str, str], bool] = {}

    # ---- mutations (each bumps the version once) -------------------------------------------
    async def _bump(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()
        self._export()

    def _export(self) -> None:
        """The routing version and the replicas per model and state, as metrics (on every change)."""
        metrics.ROUTING_VERSION.set(self.version)
        for name in self._exported - set(self.active):  # no longer routed: nothing of it is left
            for state in metrics.STATES:
                metrics.REPLICAS.labels(name, state).set(0)
        self._exported = set(self.active)
        for name, active in self.active.items():
            states = [self.state_of(r) for r in self.replicas_of(name, active.version)]
            for state in metrics.STATES:
                metrics.REPLICAS.labels(name, state).set(states.count(state))

    async def register(self, info: pb.ReplicaInfo) -> None:
        old = self.replicas.get(info.replica_id)
        self.replicas[info.replica_id] = Replica(info=info, last_seen=time.monotonic())
        self._vision[(info.model, info.version)] = info.accepts_images
        if old is None or old.info != info:
            await self._bump()

    async def heartbeat(self, beat: pb.HeartbeatRequest) -> common_pb2.ReplicaLimits | None:
        """Record a replica's load and health; its model's current limits, or None if it is unknown."""
        replica = self.replicas.get(beat.replica_id)
        if replica is None:
            return None
        was_healthy = replica.healthy
        replica.last_seen, replica.load = time.monotonic(), beat
        if replica.healthy != was_healthy:  # route around it (or back to it) at once
            await self._bump()
        active = self.active.get(replica.info.model)
        if active is not None and active.version == replica.info.version:
            return active.limits
        return replica_limits(replica.info.spec)  # an old version draining keeps its own

    def routed(self, replica_id: str) -> bool:
        """Whether the replica's version is the one its model routes to."""
        replica = self.replicas.get(replica_id)
        active = self.active.get(replica.info.model) if replica is not None else None
        return active is not None and active.version == replica.info.version  # type: ignore[union-attr]

    async def unregister(self, replica_id: str) -> None:
        if self.replicas.pop(replica_id, None) is not None:
            await self._bump()

    async def expire(self) -> list[str]:
        """Drop replicas whose heartbeats stopped."""
        cutoff = time.monotonic() - self.heartbeat_timeout_s
        gone = [rid for rid, r in self.replicas.items() if r.last_seen < cutoff]
        for rid in gone:
            del self.replicas[rid]
        if gone:
            await self._bump()
        return gone

    async def expect(self, names: Iterable[str]) -> None:
        """Count `names` as pending until they are routed (or a reconcile leaves them out)."""
        new = set(names) - self.expected - set(self.active)
        if new:
            self.expected |= new
            await self._bump()

    async def settle_expected(self, wanted: Iterable[str]) -> None:
        """A reconcile deploy ended: only what it asked for is still expected."""
        kept = self.expected & set(wanted)
        if kept != self.expected:
            self.expected = kept
            await self._bump()

    async def set_active(self, name: str, model: ActiveModel | None) -> None:
        """Route `name` to `model`'s version (None: stop routing it)."""
        if model is not None:
            self.expected.discard(name)
        if model is None:
            if self.active.pop(name, None) is None:
                return
        elif self.active.get(name) == model:
            return
        else:
            self.active[name] = model
        keep = {(n, m.version) for n, m in self.active.items()} | {
            (r.info.model, r.info.version) for r in self.replicas.values()}
        self._vision = {key: v for key, v in self._vision.items() if key in keep}  # forget retired versions
        await self._bump()

    # ---- reads -----------------------------------------------------------------------------
    def state_of(self, replica: Replica) -> str:
        """ready | unhealthy (its engine failed its health check) | unresponsive (heartbeats late)."""
        if not replica.healthy:
            return "unhealthy"
        late = time.monotonic() - replica.last_seen > self.heartbeat_timeout_s / 2
        return "unresponsive" if late else "ready"

    def replicas_of(self, name: str, version: str) -> list[Replica]:
        return [r for r in self.replicas.values() if r.info.model == name and r.info.version == version]

    def live(self, name: str, version: str) -> list[pb.ReplicaInfo]:
        """The replicas that take traffic: registered, heartbeating and healthy."""
        return [r.info for r in self.replicas_of(name, version) if r.healthy]

    def snapshot(self) -> pb.RoutingSnapshot:
        snap = pb.RoutingSnapshot(version=self.version)
        pending, unhealthy = self.expected - set(self.active), set()
        for name in sorted(self.active):
            active = self.active[name]
            replicas = sorted(self.live(name, active.version), key=lambda r: r.replica_id)
            if not replicas and not active.scale_to_zero:
                (unhealthy if self.replicas_of(name, active.version) else pending).add(name)
                continue
            first = replicas[0] if replicas else pb.ReplicaInfo()
            route = pb.ModelRoute(
                name=name, version=active.version, usecase=active.usecase or common_pb2.USECASE_GENERATE,
                max_model_len=active.max_model_len or first.max_model_len, replicas=replicas,
                embedding_dimension=first.embedding_dimension, rate_limits=active.rate_limits,
                scale_to_zero=active.scale_to_zero)
            vision = first.accepts_images if replicas else self._vision.get((name, active.version))
            if vision is not None:  # unset: no replica of this version seen yet (the worker decides)
                route.accepts_images = vision
            snap.models.append(route)
        snap.pending.extend(sorted(pending))
        snap.unhealthy.extend(sorted(unhealthy))
        return snap

    async def wait_newer(self, known: int, timeout_s: float) -> bool:
        """Wait until the version passes `known`; False on timeout (time for a keepalive)."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version > known), timeout_s)
            except TimeoutError:
                return False
        return True
