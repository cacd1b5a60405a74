"""The edge around models that scale to zero or whose engines died, with the real app, route table
and worker servicers around an engine double: a request to a model at zero replicas waits for its
cold start (asking once) and then runs, or gets 503 + Retry-After past the bound; a model whose
every replica is unhealthy is 503 (not 404) and makes /readyz 503 naming it."""

from __future__ import annotations

import asyncio

import httpx

from mship.coordinator.v1 import coordinator_pb2 as cpb
from tests.helpers import until
from tests.unit.gateway_harness import CHAT, MODEL, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)


async def at_zero(gateway: Gateway, *addresses: str, unhealthy: bool = False) -> None:
    """MODEL autoscaled to zero, routed to `addresses` (none: idle at zero); or, with `unhealthy`,
    unrouted with every replica failing its health check."""
    gateway.version += 1
    snapshot = cpb.RoutingSnapshot(version=gateway.version, unhealthy=[MODEL] if unhealthy else [])
    if not unhealthy:
        model = snapshot.models.add(name=MODEL, version="v1", max_model_len=64, scale_to_zero=True)
        for i, address in enumerate(addresses):
            host, port = address.rsplit(":", 1)
            model.replicas.add(replica_id=f"r{i}", model=MODEL, version="v1").endpoint.port = int(port)
            model.replicas[-1].endpoint.host = host
    await gateway.on_loop(lambda: gateway.table.apply(snapshot))


async def test_a_request_to_a_model_at_zero_waits_for_its_cold_start_then_runs(workers, gateway, client):
    asked: list[str] = []

    async def request_replica(model: str) -> None:
        asked.append(model)

    await gateway.on_loop(lambda: setattr(gateway.table, "request_replica", request_replica))
    await at_zero(gateway)
    r = await client.get("/readyz")
    assert (r.status_code, r.json()["scaled_to_zero"], r.json()["models"][MODEL]["state"]) == (
        200, [MODEL], "scaled_to_zero")
    waiting = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(3)]
    await until(lambda: asked, "the gateway asks for a replica")
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiting) and asked == [MODEL]  # they wait; one ask for all three
    await at_zero(gateway, workers[0].address)  # the replica serves
    for r in await asyncio.gather(*waiting):
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello world!"
    await gateway.route(workers[0].address, workers[1].address)


async def test_past_the_cold_start_bound_the_answer_is_503_with_retry_after(gateway, client):
    await gateway.on_loop(lambda: setattr(gateway.table, "cold_start_timeout_s", 0.2))
    try:
        await at_zero(gateway)
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert (r.status_code, r.json()["error"]["code"], r.headers["retry-after"]) == (503, "model_not_ready", "1")
    finally:
        await gateway.on_loop(lambda: setattr(gateway.table, "cold_start_timeout_s", 120.0))


async def test_a_model_whose_replicas_are_all_unhealthy_is_503_and_not_ready(workers, gateway, client):
    await at_zero(gateway, unhealthy=True)
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert (r.status_code, r.json()["error"]["code"], r.headers["retry-after"]) == (503, "service_unavailable", "2")
    r = await client.get("/readyz")
    assert (r.status_code, r.json()["unhealthy"], r.json()["models"][MODEL]["state"]) == (503, [MODEL], "unhealthy")
    await gateway.route(workers[0].address, workers[1].address)
    assert (await client.get("/readyz")).status_code == 200


async def test_readyz_names_every_model_with_its_state(workers, gateway):
    await gateway.route(workers[0].address, pending=("later",))
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        body = (await client.get("/readyz")).json()
    assert body["models"][MODEL] == {"state": "loaded", "replicas": 1}
    assert body["models"]["later"] == {"state": "pending", "replicas": 0}
    await gateway.route(workers[0].address, workers[1].address)
