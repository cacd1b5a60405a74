"""Faults around the state store: an EXEC whose reply is lost (Redis), an expiry sweep that meets
a run it cannot expire, a background start whose first append fails, and leases no clock can end
(NaN, infinite: raw gRPC may send them). The Redis cases start a server (integration)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from redis.asyncio.client import Pipeline

from mship.state.v1 import state_pb2 as pb
from mship.worker.v1 import worker_pb2
from services.common.errors import ErrorDetails, Reason, ServiceError
from services.gateway.responses.background import BackgroundRuns
from services.gateway.responses.protocol_events import ResponseStreamEncoder
from services.gateway.responses.turns import Turn
from services.state.client import Unavailable
from services.state.memory_store import MemoryStore
from services.state.redis_store import RedisStore, _keys
from services.state.servicer import StateServicer
from services.state.store import Store
from tests.redis_server import RedisServer
from tests.store_contract import Clock, ev, snap
from tests.unit.responses_scripts import request

ALICE = "alice"
QUEUED, IN_PROGRESS, COMPLETED = pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_IN_PROGRESS, pb.RUN_STATUS_COMPLETED


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("faults-redis")))
    yield server
    server.stop()


@pytest.fixture
async def redis_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    with redis.Redis(host="127.0.0.1", port=redis_server.port) as raw:
        raw.flushdb()
    store = RedisStore(redis_server.url, clock=Clock())
    yield store
    await store.close()


class LostReplies:
    """The next `n` EXECs are applied, but their replies never arrive: the connection drops while
    redis-py reads them (so it still counts the keys as watched, as after a real drop)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pending = 0
        self.lost = 0
        original = Pipeline._execute_transaction

        async def execute(pipe: Pipeline, connection: Any, commands: Any, raise_on_error: bool) -> Any:
            watching = pipe.watching
            reply = await original(pipe, connection, commands, raise_on_error)
            if self.pending:
                self.pending -= 1
                self.lost += 1
                pipe.watching = watching  # the reply that would have cleared it never came
                raise redis.ConnectionError("connection lost before EXEC's reply")
            return reply

        monkeypatch.setattr(Pipeline, "_execute_transaction", execute)

    async def once(self, op: Awaitable[Any]) -> Any:
        self.pending = 1
        try:
            return await op
        finally:
            assert self.pending == 0 and self.lost, "no EXEC was made"
            self.lost = 0


async def logged(store: Store, rid: str) -> list[tuple[int, str, bool]]:
    return [(e.sequence, e.event_json, e.terminal) async for e in store.read_events(ALICE, rid)]


# ---- a lost EXEC reply: the retry must find the write landed, not a conflict ----------------------

@pytest.mark.integration
async def test_a_create_whose_reply_was_lost_is_created_once(redis_store: RedisStore, monkeypatch):
    lost = LostReplies(monkeypatch)
    record = await lost.once(redis_store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30))
    assert record.status == QUEUED and (await redis_store.get_run(ALICE, "r")) == record


@pytest.mark.integration
async def test_a_start_whose_reply_was_lost_is_in_progress(redis_store: RedisStore, monkeypatch):
    await redis_store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    lost = LostReplies(monkeypatch)
    record = await lost.once(redis_store.set_run_status(ALICE, "r", IN_PROGRESS, expected=[QUEUED], owner="gw1",
                                                        lease_s=30))
    assert record.status == IN_PROGRESS and (await redis_store.get_run(ALICE, "r")) == record


@pytest.mark.integration
async def test_appends_whose_replies_were_lost_land_once(redis_store: RedisStore, monkeypatch):
    await redis_store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    lost = LostReplies(monkeypatch)
    assert await lost.once(redis_store.append_events(ALICE, "r", [ev(1), ev(2)], owner="gw1")) == 2
    numbered = [pb.RunEvent(event_json='{"n": 3}')]  # numbered by the store: a re-run would add it again
    assert await lost.once(redis_store.append_events(ALICE, "r", numbered, owner="gw1")) == 3
    assert await logged(redis_store, "r") == [(1, '{"n": 1}', False), (2, '{"n": 2}', False), (3, '{"n": 3}', False)]


@pytest.mark.integration
async def test_a_finish_whose_reply_was_lost_is_finished(redis_store: RedisStore, monkeypatch):
    await redis_store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    await redis_store.append_events(ALICE, "r", [ev(1)], owner="gw1")
    lost = LostReplies(monkeypatch)
    record = await lost.once(redis_store.finish_run(ALICE, "r", COMPLETED, owner="gw1",
                                                    response=snap(ALICE, "r", "final"),
                                                    events=[ev(2, terminal=True)]))
    assert record.status == COMPLETED and record.last_sequence == 2
    assert [s for s, _, _ in await logged(redis_store, "r")] == [1, 2]
    assert (await redis_store.get_response(ALICE, "r")).response_json.endswith('"final"}')


@pytest.mark.integration
async def test_a_lost_reply_is_still_a_conflict_when_another_write_came_first(redis_store: RedisStore,
                                                                               monkeypatch):
    """The check is for this call's own write: a cancel that landed instead still wins."""
    await redis_store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    lost = LostReplies(monkeypatch)
    await lost.once(redis_store.finish_run(ALICE, "r", pb.RUN_STATUS_CANCELLED))
    with pytest.raises(ServiceError) as info:
        await redis_store.append_events(ALICE, "r", [ev(1)], owner="gw1")
    assert info.value.code == grpc.StatusCode.ABORTED


# ---- the expiry sweep: one run it cannot expire does not keep the others unswept ----------------

async def expired_three(store: Store, clock: Clock) -> None:
    for rid in ("a", "bad", "c"):
        await store.create_run(snap(ALICE, rid), status=IN_PROGRESS, owner="gw1", lease_s=10)
    clock.now += 11


async def test_the_sweep_skips_a_run_it_cannot_expire_and_says_so(caplog: pytest.LogCaptureFixture):
    clock = Clock()
    store = MemoryStore(clock=clock)
    await expired_three(store, clock)
    expire = store._expire

    async def failing(identity: str, response_id: str) -> pb.RunStatusRecord:
        if response_id == "bad":
            raise ServiceError(grpc.StatusCode.INTERNAL, Reason.ERROR_REASON_UNSPECIFIED, "a record no rule applies to")
        return await expire(identity, response_id)

    store._expire = failing  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, "services.state.store"):
        failed = await store.expire_runs()
    assert sorted(r.key.response_id for r in failed) == ["a", "c"]
    assert "'bad'" in caplog.text and "a record no rule applies to" in caplog.text


async def test_an_unavailable_store_still_ends_the_sweep():
    clock = Clock()
    store = MemoryStore(clock=clock)
    await expired_three(store, clock)

    async def down(identity: str, response_id: str) -> pb.RunStatusRecord:
        raise ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.STORE_UNAVAILABLE, "down")

    store._expire = down  # type: ignore[method-assign]
    with pytest.raises(ServiceError) as info:
        await store.expire_runs()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
async def test_the_redis_sweep_skips_a_record_it_cannot_read(redis_store: RedisStore, redis_server: RedisServer,
                                                             caplog: pytest.LogCaptureFixture):
    await expired_three(redis_store, redis_store.clock)  # type: ignore[arg-type]
    with redis.Redis(host="127.0.0.1", port=redis_server.port) as raw:
        raw.set(_keys(ALICE, "bad")[1], b"\xff\xff not a StoredRun")
    with caplog.at_level(logging.WARNING, "services.state.store"):
        failed = await redis_store.expire_runs()
    assert sorted(r.key.response_id for r in failed) == ["a", "c"]
    assert "'bad'" in caplog.text


# ---- a background start whose first append fails leaves no run behind ---------------------------

class StateOverMemory:
    """The StateClient calls BackgroundRuns.start makes, over a MemoryStore; `append_events` runs `append`."""

    def __init__(self, append: Callable[[], Awaitable[None]]) -> None:
        self.store = MemoryStore()
        self.append = append
        self.created = ""

    async def create_run(self, response: pb.StoredResponse, owner: str, lease_s: float, status: int = QUEUED,
                         failure_event_json: str = "") -> pb.RunStatusRecord:
        self.created = response.key.response_id
        return await self.store.create_run(response, status, owner, lease_s, failure_event_json)

    async def append_events(self, *args: Any, **kwargs: Any) -> int:
        await self.append()
        raise AssertionError("append_events was to fail")

    async def delete_response(self, identity: str, response_id: str) -> bool:
        return await self.store.delete_response(identity, response_id)


def background_turn() -> Turn:
    req = request(background=True)
    return Turn(req=req, identity=ALICE, history=[], inputs=[], encoder=ResponseStreamEncoder.for_request(req),
                infer=worker_pb2.InferRequest())


async def start_fails(state: StateOverMemory, stop: Callable[[asyncio.Task], Awaitable[None]]) -> None:
    runs = BackgroundRuns(None, state, "gw1")  # type: ignore[arg-type] # start reads no route table
    turn = background_turn()
    await stop(asyncio.create_task(runs.start(turn)))
    await asyncio.gather(*runs.cleanups)
    assert state.created == turn.encoder.id and await state.store.get_response(ALICE, state.created) is None
    assert not runs.tasks


async def test_a_start_whose_first_append_fails_deletes_its_run():
    async def unavailable() -> None:
        raise Unavailable(ErrorDetails(grpc.StatusCode.UNAVAILABLE, "the state store is unavailable"))

    async def fails(start: asyncio.Task) -> None:
        with pytest.raises(Unavailable):
            await start
    await start_fails(StateOverMemory(unavailable), fails)


async def test_a_start_cancelled_in_its_first_append_deletes_its_run():
    appending = asyncio.Event()

    async def forever() -> None:
        appending.set()
        await asyncio.Event().wait()

    async def cancel(start: asyncio.Task) -> None:
        await appending.wait()
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
    await start_fails(StateOverMemory(forever), cancel)


# ---- leases no clock can end (what raw gRPC may send: the client checks nothing) ------------------

@pytest.mark.parametrize("lease_s", [math.nan, math.inf, -math.inf, 1e12],
                         ids=["nan", "inf", "-inf", "too-long"])
async def test_a_lease_no_clock_can_end_is_refused_naming_the_field(lease_s: float):
    servicer = StateServicer(MemoryStore())
    key = pb.ResponseKey(identity=ALICE, response_id="r")
    created = await servicer.CreateRun(pb.CreateRunRequest(response=snap(ALICE, "r"), owner="gw1", lease_s=5), None)
    calls = [servicer.CreateRun(pb.CreateRunRequest(response=snap(ALICE, "r2"), owner="gw1", lease_s=lease_s), None),
             servicer.RenewRun(pb.RenewRunRequest(key=key, owner="gw1", lease_s=lease_s), None),
             servicer.SetRunStatus(pb.SetRunStatusRequest(key=key, status=IN_PROGRESS, owner="gw1", lease_s=lease_s),
                                   None)]
    for call in calls:
        with pytest.raises(ServiceError) as info:
            await call
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [f for f, _ in info.value.field_violations] == ["lease_s"], info.value.field_violations
    assert await servicer.GetRunStatus(pb.GetRunStatusRequest(key=key), None) == created  # untouched
    assert await servicer.store.get_run(ALICE, "r2") is None


async def test_a_sweep_that_raises_unexpectedly_does_not_end_the_sweeps():
    from services.state.server import serve_store

    store, sweeps, third = MemoryStore(), [], asyncio.Event()

    async def expire_runs(*args: Any, **kwargs: Any) -> list[pb.RunStatusRecord]:
        sweeps.append(1)
        if len(sweeps) == 1:
            raise ValueError("a malformed lease index entry")
        if len(sweeps) == 3:
            third.set()
        return []

    store.expire_runs = expire_runs  # type: ignore[method-assign]
    server, _ = await serve_store(store, "127.0.0.1", 0, sweep_interval_s=0.01)
    try:
        await asyncio.wait_for(third.wait(), 5)  # sweeps went on after the one that raised
        assert not server.mship_housekeeping.done()
    finally:
        await server.stop(0)
