"""The state service as a service, beyond the Store contract it shares with the backends
(tests/unit/test_state_store.py runs that over the service too): the client's error classes,
input-item pages, request validation, committed model sets; on a real Redis (Debian's
redis-server) durability across a restart of the service, the password from the environment, the
server's own lease sweep, and a clean UNAVAILABLE when Redis is down."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest
import redis
from redis.asyncio.client import Pipeline

from mship.common.v1 import common_pb2
from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.errors import ErrorDetails
from services.state import client as sc
from services.state.server import start_state_server
from services.state.store import key_path
from tests.redis_server import RedisServer
from tests.store_contract import ev, open_backend, snap

pytestmark = pytest.mark.integration
MODELS = [common_pb2.ModelSpec(name="chat", model="builtin:gemma-3-270m", num_replicas=2)]
PASSWORD = "s3cret"
ALICE, BOB = "alice", "bob"
IN_PROGRESS, COMPLETED = pb.RUN_STATUS_IN_PROGRESS, pb.RUN_STATUS_COMPLETED
CANCELLED, FAILED = pb.RUN_STATUS_CANCELLED, pb.RUN_STATUS_FAILED
FINISHED_NAMES = "RUN_STATUS_COMPLETED, RUN_STATUS_INCOMPLETE, RUN_STATUS_FAILED, RUN_STATUS_CANCELLED"


@pytest.fixture
def redis_server(tmp_path, monkeypatch):
    server = RedisServer(tmp_path, password=PASSWORD)
    monkeypatch.setenv("MSHIP_REDIS_PASSWORD", PASSWORD)
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def serving(url: str, sweep_interval_s: float | None = None) -> AsyncIterator[sc.StateClient]:
    server, port = await start_state_server(url, "127.0.0.1", 0, sweep_interval_s=sweep_interval_s)
    client = sc.StateClient(f"127.0.0.1:{port}")
    try:
        yield client
    finally:
        await client.close()
        await server.stop(0)


@pytest.fixture(params=["memory", "redis"])
async def state(request, tmp_path) -> AsyncIterator[sc.StateClient]:
    """A state server on each backend, and a client of it."""
    redis_servers: list[RedisServer] = []

    def fresh_redis() -> str:
        redis_servers.append(RedisServer(tmp_path))
        return redis_servers[-1].url

    try:
        async with open_backend(f"service:{request.param}", fresh_redis) as backend:
            yield backend.store.client
    finally:
        for server in redis_servers:
            server.stop()


async def sequences(state: sc.StateClient, rid: str, after: int = 0, follow: bool = False,
                    identity: str = ALICE) -> list[int]:
    return [e.sequence async for e in state.read_events(identity, rid, after, follow)]


async def poll(check, timeout_s: float = 10.0, interval_s: float = 0.02):
    """`await check()` until it returns something truthy (a deadline, not a sleep to sync on)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(interval_s)


# ---- committed model sets (in use by the coordinator) --------------------------------------------

async def _put_then_get(url: str, put: bool) -> pb.ModelSet:
    server, port = await start_state_server(url, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = state_pb2_grpc.StateStub(channel)
            if put:
                await stub.PutModelSet(pb.PutModelSetRequest(model_set=pb.ModelSet(
                    gateway="default", models=MODELS, deploy_id="d1")))
            return await stub.GetModelSet(pb.GetModelSetRequest(gateway="default"))
    finally:
        await server.stop(0)


async def test_committed_set_survives_a_state_service_restart(redis_server):
    first = await _put_then_get(redis_server.url, put=True)
    again = await _put_then_get(redis_server.url, put=False)  # a new server process-state, same Redis
    assert list(again.models) == MODELS and again.deploy_id == "d1" and again.committed_at == first.committed_at


async def test_memory_backend_is_per_process():
    await _put_then_get("memory://", put=True)
    assert list((await _put_then_get("memory://", put=False)).models) == []


# ---- the client's view ---------------------------------------------------------------------------

async def test_the_client_raises_one_class_per_refusal(state: sc.StateClient):
    await state.create_run(snap(ALICE, "r", "secret", items=("i1",)), owner="gw1", lease_s=30)
    await state.append_events(ALICE, "r", [ev(1, "secret event")], owner="gw1")
    for attempt in (state.get_response(BOB, "r"), state.list_input_items(BOB, "r"), state.get_run_status(BOB, "r"),
                    sequences(state, "r", identity=BOB)):
        with pytest.raises(sc.NotFound) as info:
            await attempt
        assert info.value.details.reason == "NOT_FOUND" and "secret" not in info.value.details.message
    with pytest.raises(sc.AlreadyExists):
        await state.put_response(snap(ALICE, "r", "again"), create_only=True)
    with pytest.raises(sc.Conflict) as conflict:  # a retried append (its reply was lost)
        await state.append_events(ALICE, "r", [ev(1)], owner="gw1")
    assert (conflict.value.details.reason, conflict.value.last_sequence) == ("CONFLICT", 1)
    await state.cancel_run(ALICE, "r", snap(ALICE, "r", "cancelled"), '{"type": "response.cancelled"}')
    with pytest.raises(sc.Conflict) as conflict:
        await state.renew_run(ALICE, "r", "gw1", 30)  # how the owner learns it should stop
    assert (conflict.value.status, conflict.value.owner) == (CANCELLED, "gw1")
    assert [e.event_json async for e in state.read_events(ALICE, "r")] == [
        'secret event', '{"type": "response.cancelled"}']


async def test_input_items_are_listed_from_the_snapshot(state: sc.StateClient):
    await state.put_response(snap(ALICE, "r", items=tuple(f"i{n}" for n in range(25))))
    page = await state.list_input_items(ALICE, "r")  # 20, newest first
    assert len(page.data) == 20 and page.first_id == "i24" and page.last_id == "i5" and page.has_more
    rest = await state.list_input_items(ALICE, "r", after=page.last_id)
    assert [i.id for i in rest.data] == ["i4", "i3", "i2", "i1", "i0"] and not rest.has_more
    asc = await state.list_input_items(ALICE, "r", limit=2, order="asc", after="i0")
    assert [(i.id, i.item_json) for i in asc.data] == [("i1", '{"id": "i1"}'), ("i2", '{"id": "i2"}')]


async def test_malformed_requests_name_their_fields(state: sc.StateClient):
    cases = [
        (state.get_response("", "r"), [("key.identity", "required")]),
        (state.put_response(pb.StoredResponse(key=sc.key(ALICE, ""))), [("response.key.response_id", "required")]),
        (state.put_response(snap(ALICE, "r", items=("a", "a"))), [("response.input_items[1].id", "duplicate id 'a'")]),
        (state.list_input_items(ALICE, "r", limit=101), [("limit", "must be between 1 and 100")]),
        (state.create_run(snap(ALICE, "r"), owner="", lease_s=5), [("owner", "required with a lease")]),
        (state.finish_run(ALICE, "r", IN_PROGRESS), [("status", f"must be one of {FINISHED_NAMES}")]),
        (state.append_events(ALICE, "r", []), [("events", "at least one event")]),
        (state.append_events(ALICE, "r", [ev(1, terminal=True)]),
         [("events[0].terminal", "the terminal event is written by FinishRun")]),
        (state.renew_run(ALICE, "r", "gw1", 0), [("lease_s", "must be positive")]),
    ]
    for call, violations in cases:
        with pytest.raises(sc.StateError) as info:
            await call
        details = info.value.details
        assert (details.code, details.reason, details.field_violations) == (
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER", violations)


# ---- lease sweep, durability, outages, crashes (Redis) ---------------------------------------

async def test_the_state_server_sweeps_expired_runs_by_itself(redis_server):
    async with serving(redis_server.url, sweep_interval_s=0.1) as state:
        await state.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=0.3)
        raw = redis.Redis(host="127.0.0.1", port=redis_server.port, password=PASSWORD)
        run_key = f"mship:runs/{key_path(ALICE, 'r')}"

        async def failed_in_redis() -> bool:  # not through the service: a read would expire it too
            return pb.StoredRun.FromString(raw.get(run_key)).record.status == FAILED
        await poll(failed_in_redis)
        assert raw.zcard("mship:runs:leases") == 0
        raw.close()


async def test_everything_survives_a_state_service_restart(redis_server):
    async with serving(redis_server.url) as state:
        await state.put_response(snap(ALICE, "p", "hi", '["u1"]'))
        await state.put_response(snap(ALICE, "c", "child", '["u1", "a1", "u2"]', parent="p"))
        await state.put_response(snap(ALICE, "b", "branch", '["u1", "a1", "B"]', parent="p"))
        await state.delete_response(ALICE, "p")
        await state.create_run(snap(ALICE, "cancelled"), owner="gw1", lease_s=300)
        await state.cancel_run(ALICE, "cancelled", event_json='"cancelled"')
        await state.create_run(snap(ALICE, "running"), status=IN_PROGRESS, owner="gw1", lease_s=300)
        await state.append_events(ALICE, "running", [ev(1), ev(2), ev(3)], owner="gw1")
    async with serving(redis_server.url) as state:  # a new server, the same Redis
        with pytest.raises(sc.NotFound):
            await state.get_response(ALICE, "p")
        assert (await state.get_response(ALICE, "c")).conversation_json == '["u1", "a1", "u2"]'
        assert (await state.get_response(ALICE, "b")).conversation_json == '["u1", "a1", "B"]'
        assert (await state.get_run_status(ALICE, "cancelled")).status == CANCELLED
        with pytest.raises(sc.Conflict):
            await state.set_run_status(ALICE, "cancelled", IN_PROGRESS)
        assert (await state.get_run_status(ALICE, "running")).status == IN_PROGRESS
        follower = asyncio.create_task(sequences(state, "running", after=1, follow=True))
        await state.append_events(ALICE, "running", [ev(4)], owner="gw1")  # the owner carries on
        await state.finish_run(ALICE, "running", COMPLETED, owner="gw1", events=[ev(5, terminal=True)])
        assert await asyncio.wait_for(follower, 10) == [2, 3, 4, 5]


async def test_redis_outage_is_a_clean_unavailable(redis_server):
    url = redis_server.url
    redis_server.stop()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _put_then_get(url, put=True)
    details = ErrorDetails.from_rpc_error(info.value)
    assert (details.code, details.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")
    async with serving(url) as state:
        for call in (state.put_response(snap(ALICE, "r")), state.get_response(ALICE, "r"),
                     state.create_run(snap(ALICE, "r"), owner="gw1", lease_s=5),
                     state.finish_run(ALICE, "r", CANCELLED), state.append_events(ALICE, "r", [ev(1)]),
                     sequences(state, "r", follow=True), state.expire_runs()):
            with pytest.raises(sc.Unavailable) as info:
                await call
            assert info.value.details.reason == "STORE_UNAVAILABLE" and info.value.details.retry_after_s == 1.0


async def test_a_crash_in_the_middle_of_a_finish_writes_nothing(redis_server, tmp_path, monkeypatch):
    async with serving(redis_server.url) as state:
        await state.create_run(snap(ALICE, "r", "running"), status=IN_PROGRESS, owner="gw1", lease_s=300)
        await state.append_events(ALICE, "r", [ev(1), ev(2)], owner="gw1")
        real_execute = Pipeline.execute

        async def crash_before_exec(self, *args, **kwargs):
            if self.explicit_transaction:  # the finish's writes are queued, about to be sent
                redis_server.stop()
            return await real_execute(self, *args, **kwargs)

        monkeypatch.setattr(Pipeline, "execute", crash_before_exec)
        with pytest.raises(sc.Unavailable):
            await state.finish_run(ALICE, "r", COMPLETED, owner="gw1", response=snap(ALICE, "r", "final"),
                                   events=[ev(3), ev(4, terminal=True)])
        monkeypatch.undo()
    restarted = RedisServer(tmp_path, password=PASSWORD)  # the same data directory (AOF, fsync always)
    monkeypatch.setenv("MSHIP_REDIS_PASSWORD", PASSWORD)
    try:
        async with serving(restarted.url) as state:
            stored = await state.get_response(ALICE, "r")
            assert '"running"' in stored.response_json and stored.run.status == IN_PROGRESS
            assert stored.run.last_sequence == 2 and await sequences(state, "r") == [1, 2]
            # ... and the retried finish lands whole.
            await state.finish_run(ALICE, "r", COMPLETED, owner="gw1", response=snap(ALICE, "r", "final"),
                                   events=[ev(3), ev(4, terminal=True)])
            stored = await state.get_response(ALICE, "r")
            assert '"final"' in stored.response_json and stored.run.status == COMPLETED
            assert await sequences(state, "r") == [1, 2, 3, 4]
    finally:
        restarted.stop()
