"""Replica choice behind the `ReplicaPicker` interface: `LeastOutstanding` on its own, and the
route table asking its picker (channels and snapshots stay the table's)."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common.breaker import EndpointBreaker
from services.common.picker import E, LeastOutstanding
from services.common.routes import RouteTable


@dataclass
class Replica:
    address: str
    outstanding: int = 0


def addresses(endpoints: Sequence[Replica]) -> list[str]:
    return [e.address for e in endpoints]


def test_least_outstanding_first():
    a, b, c = Replica("a", 2), Replica("b", 0), Replica("c", 1)
    assert addresses(LeastOutstanding().order([a, b, c], set())) == ["b", "c", "a"]


def test_ties_are_broken_at_random():
    picker = LeastOutstanding(random.Random(7))
    replicas = [Replica("a"), Replica("b"), Replica("c", 1)]
    firsts = {picker.order(replicas, set())[0].address for _ in range(50)}
    assert firsts == {"a", "b"}  # both tied replicas lead sometimes; the busier one never does
    assert all(picker.order(replicas, set())[-1].address == "c" for _ in range(20))


def test_bad_endpoints_are_skipped_unless_all_are():
    a, b = Replica("a"), Replica("b", 5)
    picker = LeastOutstanding()
    assert addresses(picker.order([a, b], {"a"})) == ["b"]
    assert sorted(addresses(picker.order([a, b], {"a", "b"}))) == ["a", "b"]  # all bad: try them all again
    assert picker.order([], set()) == []


class Reversed:
    """A stand-in policy: the table's order, backwards; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[str], set[str]]] = []

    def order(self, endpoints: Sequence[E], bad: Collection[str]) -> list[E]:
        self.asked.append((addresses(endpoints), set(bad)))  # type: ignore[arg-type]
        return list(reversed(endpoints))


def snapshot(version: int, ports: list[int]) -> cpb.RoutingSnapshot:
    out = cpb.RoutingSnapshot(version=version)
    route = out.models.add(name="m", version="v1")
    for port in ports:
        replica = route.replicas.add(replica_id=f"r{port}", model="m", version="v1")
        replica.endpoint.host, replica.endpoint.port = "127.0.0.1", port
    return out


async def test_the_route_table_asks_its_picker():
    picker = Reversed()
    table = RouteTable(picker, breaker=EndpointBreaker(threshold=1, cooldown_s=600))
    try:
        table.apply(snapshot(1, [1, 2]))
        assert addresses(table.candidates("m")) == ["127.0.0.1:2", "127.0.0.1:1"]  # type: ignore[arg-type]
        table.mark_bad(table.routes["m"].endpoints[0])
        table.candidates("m")
        assert picker.asked[-1] == (["127.0.0.1:1", "127.0.0.1:2"], {"127.0.0.1:1"})
        table.apply(snapshot(2, [1, 2]))  # the breaker's state outlives a snapshot that keeps the endpoint...
        table.candidates("m")
        assert picker.asked[-1][1] == {"127.0.0.1:1"}
        table.apply(snapshot(3, [2]))  # ...and is dropped with an endpoint that leaves
        table.candidates("m")
        assert picker.asked[-1][1] == set()
        assert table.candidates("other") == [] and len(picker.asked) == 4
    finally:
        await table.close()


async def test_the_default_picker_is_least_outstanding():
    table = RouteTable()
    try:
        table.apply(snapshot(1, [1, 2]))
        table.routes["m"].endpoints[0].outstanding = 3
        assert addresses(table.candidates("m")) == ["127.0.0.1:2", "127.0.0.1:1"]  # type: ignore[arg-type]
    finally:
        await table.close()
