"""Per-node load leases: replicas on one node load their models one at a time, so their memory
spikes never overlap. A lease has a TTL and is renewed while loading; a dead loader's expires.

A bounded history of grants (with when and how each ended) is kept so that operators and tests can
see who loaded when on each node."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from dataclasses import dataclass

from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.metrics import LEASE_WAIT

HISTORY = 256  # lease records kept, oldest dropped first


@dataclass
class NodeLease:
    lease_id: str
    node_id: str
    holder: str
    expires_at: float  # wall clock, for the wire
    deadline: float    # monotonic, for expiry


class LeaseManager:
    def __init__(self) -> None:
        self._held: dict[str, NodeLease] = {}  # node_id -> lease
        self._by_id: dict[str, NodeLease] = {}
        self._records: collections.OrderedDict[str, pb.LeaseRecord] = collections.OrderedDict()
        self._changed = asyncio.Condition()

    def _expire(self, node_id: str) -> None:
        lease = self._held.get(node_id)
        if lease is not None and lease.deadline <= time.monotonic():
            del self._held[node_id]
            self._by_id.pop(lease.lease_id, None)
            # It ended when its holder stopped renewing, not when someone noticed.
            self._end(lease.lease_id, pb.LEASE_END_EXPIRED, lease.expires_at)

    async def acquire(self, node_id: str, holder: str, ttl_s: float, wait_s: float) -> NodeLease | None:
        started = time.monotonic()
        deadline = started + max(0.0, wait_s)
        async with self._changed:
            while True:
                self._expire(node_id)
                current = self._held.get(node_id)
                if current is None or current.holder == holder:
                    LEASE_WAIT.observe(time.monotonic() - started)
                    return self._grant(node_id, holder, ttl_s, current)
                remaining = min(deadline, current.deadline) - time.monotonic()
                if time.monotonic() >= deadline:
                    return None
                try:  # woken by a release, or at the holder's expiry
                    await asyncio.wait_for(self._changed.wait(), max(0.01, remaining))
                except TimeoutError:
                    pass

    def _grant(self, node_id: str, holder: str, ttl_s: float, current: NodeLease | None) -> NodeLease:
        lease_id = current.lease_id if current else uuid.uuid4().hex
        lease = NodeLease(lease_id, node_id, holder, time.time() + ttl_s, time.monotonic() + ttl_s)
        self._held[node_id] = self._by_id[lease_id] = lease
        if current is None:
            self._records[lease_id] = pb.LeaseRecord(lease_id=lease_id, node_id=node_id, holder=holder,
                                                     granted_at=time.time())
            while len(self._records) > HISTORY:
                self._records.popitem(last=False)
        return lease

    def _end(self, lease_id: str, how: int, at: float | None = None) -> None:
        record = self._records.get(lease_id)
        if record is not None and not record.ended_at:
            record.ended_at, record.end = at or time.time(), how

    async def renew(self, lease_id: str, ttl_s: float) -> NodeLease | None:
        async with self._changed:
            lease = self._by_id.get(lease_id)
            if lease is None:
                return None
            self._expire(lease.node_id)
            if lease_id not in self._by_id:
                return None
            return self._grant(lease.node_id, lease.holder, ttl_s, lease)

    async def release(self, lease_id: str) -> None:
        async with self._changed:
            lease = self._by_id.pop(lease_id, None)
            if lease is not None and self._held.get(lease.node_id) is lease:
                del self._held[lease.node_id]
                self._end(lease_id, pb.LEASE_END_RELEASED)
            self._changed.notify_all()

    def records(self, node_id: str = "") -> list[pb.LeaseRecord]:
        """Held and recent leases, oldest first (expiry is applied first, so none shows as held late)."""
        for node in list(self._held):
            self._expire(node)
        return [r for r in self._records.values() if not node_id or r.node_id == node_id]
