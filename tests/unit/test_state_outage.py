"""A state store that hangs, and a state service that does not answer in time: each is a prompt
UNAVAILABLE, which the gateway answers 503 `store_unavailable` with Retry-After, never a 500 after
the client's deadline; and the client remembers an outage for a moment, so the gateway can refuse
before any engine work without asking (tests/unit/test_responses_state.py shows that end to end)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from mship.state.v1 import state_pb2 as pb
from services.common.errors import ServiceError
from services.gateway.responses.conversation import store_error
from services.state import client as sc
from services.state.memory_store import MemoryStore
from services.state.redis_store import RedisStore
from services.state.server import serve_store

pytestmark = pytest.mark.timeout(60)
KEY = pb.ResponseKey(identity="alice", response_id="r")


@contextlib.asynccontextmanager
async def black_hole() -> AsyncIterator[str]:
    """A redis:// URL whose server accepts connections and never answers (a SIGSTOPped Redis)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    finally:
        for writer in held:
            writer.close()
        server.close()


def test_a_store_call_ends_well_within_the_clients_deadline():
    assert RedisStore("redis://127.0.0.1:1/0").call_timeout_s <= sc.StateClient("127.0.0.1:1").timeout_s / 2


async def test_a_hung_redis_is_unavailable_within_the_bound():
    """Found with a SIGSTOPped Redis: 5 s socket timeout x 4 tries, past the client's 10 s deadline."""
    async with black_hole() as url:
        store = RedisStore(url, call_timeout_s=0.3)
        ops = [store.get_response("alice", "r"), store.put_response(pb.StoredResponse(key=KEY)),
               store.create_run(pb.StoredResponse(key=KEY), owner="gw", lease_s=10),  # a transaction
               store.append_events("alice", "r", [pb.RunEvent(event_json="{}")]), store.delete_response("alice", "r")]
        try:
            for op in ops:
                t0 = time.monotonic()
                with pytest.raises(ServiceError) as info:
                    await op
                assert info.value.code == grpc.StatusCode.UNAVAILABLE and "0.3 s" in info.value.message
                assert info.value.retry_after_s and time.monotonic() - t0 < 1.5
        finally:
            await store.close()


class HungStore(MemoryStore):
    async def _load(self, identity: str, response_id: str):
        await asyncio.sleep(30)
        return await super()._load(identity, response_id)


async def test_a_state_service_past_the_deadline_is_503_with_retry_after():
    server, port = await serve_store(HungStore(), "127.0.0.1", 0, sweep_interval_s=None)
    client = sc.StateClient(f"127.0.0.1:{port}", timeout_s=0.2)
    try:
        await client.put_response(pb.StoredResponse(key=KEY))
        assert not client.known_down()
        with pytest.raises(sc.Unavailable) as info:
            await client.get_response("alice", "r")
        assert info.value.details.code == grpc.StatusCode.DEADLINE_EXCEEDED
        err = store_error(info.value)
        assert (err.status, err.type, err.code, err.headers) == (503, "server_error", "store_unavailable",
                                                                 {"Retry-After": "1"})
        assert client.known_down()  # for a moment: the gateway refuses without asking
        await client.put_response(pb.StoredResponse(key=KEY))
        assert not client.known_down()  # it answered again
    finally:
        await client.close()
        await server.stop(0)


async def test_a_client_that_never_reached_the_service_does_not_claim_to_know():
    client = sc.StateClient("127.0.0.1:1")
    try:
        assert not client.known_down()  # an idle channel knows nothing yet: the request goes on
        with pytest.raises(sc.Unavailable):
            await client.get_response("alice", "r")
        assert client.known_down()
        await asyncio.sleep(sc.DOWN_FOR_S + 0.1)
        assert client.known_down()  # past the failed call's moment, the channel (reconnecting, failing) says so
    finally:
        await client.close()
