"""The Store contract: one suite over the memory backend, Redis (Debian's redis-server) and the gRPC
state service fronting either, all on a fake clock: identity scoping, self-contained snapshots,
compare-and-set runs, atomic finish, event logs and their followers, owner lease expiry.
Only the memory case is in the fast tier; the others start servers (integration)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import redis

from mship.state.v1 import state_pb2 as pb
from services.common.errors import ServiceError
from services.state import runs
from tests.redis_server import RedisServer
from tests.store_contract import BACKENDS, WAKE_ON_DELETE, Backend, ev, open_backend, snap, watch_waits

ALICE, BOB = "alice", "bob"
QUEUED, IN_PROGRESS, COMPLETED = pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_IN_PROGRESS, pb.RUN_STATUS_COMPLETED
CANCELLED, FAILED = pb.RUN_STATUS_CANCELLED, pb.RUN_STATUS_FAILED


@pytest.fixture(scope="session")
def contract_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("contract-redis")))
    yield server
    server.stop()


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    def empty_redis() -> str:
        server: RedisServer = request.getfixturevalue("contract_redis")
        with redis.Redis(host="127.0.0.1", port=server.port) as raw:
            raw.flushdb()
        return server.url

    async with open_backend(request.param, empty_redis) as opened:
        yield opened


async def events_of(store, identity: str, rid: str, after: int = 0, follow: bool = False) -> list[int]:
    return [e.sequence async for e in store.read_events(identity, rid, after, follow)]


def conflict_status(err: ServiceError) -> tuple[grpc.StatusCode, str]:
    return err.code, pb.RunStatus.Name(pb.RunStatus.Value(err.metadata.get("status", "RUN_STATUS_UNSPECIFIED")))


# ---- responses ------------------------------------------------------------------------------------

async def test_another_identity_sees_nothing(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r", "secret", items=("i1",)), owner="gw1", lease_s=30)
    await store.append_events(ALICE, "r", [ev(1, "secret event")])
    assert await store.get_response(BOB, "r") is None and await store.get_run(BOB, "r") is None
    attempts = [store.append_events(BOB, "r", [ev(2)]), store.finish_run(BOB, "r", CANCELLED),
                store.set_run_status(BOB, "r", IN_PROGRESS), store.renew_run(BOB, "r", "gw1", 30),
                events_of(store, BOB, "r")]
    for attempt in attempts:
        with pytest.raises(ServiceError) as info:
            await attempt
        assert info.value.code == grpc.StatusCode.NOT_FOUND and "secret" not in info.value.message
    assert await store.delete_response(BOB, "r") is False
    mine = await store.get_response(ALICE, "r")
    assert '"secret"' in mine.response_json and mine.run.status == QUEUED and mine.run.owner == "gw1"


async def test_slash_in_identity_cannot_reach_another_identity(backend: Backend):
    await backend.store.put_response(snap("a", "b/c", "mine"))
    assert await backend.store.get_response("a/b", "c") is None
    assert (await backend.store.get_response("a", "b/c")).response_json.endswith('"mine"}')


async def test_create_only_refuses_a_taken_id(backend: Backend):
    store = backend.store
    await store.put_response(snap(ALICE, "r1", "first"), create_only=True)
    with pytest.raises(ServiceError) as info:
        await store.put_response(snap(ALICE, "r1", "second"), create_only=True)
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
    stored = await store.get_response(ALICE, "r1")
    assert '"first"' in stored.response_json and stored.created_at == backend.clock.now
    assert not stored.HasField("run")


async def test_deleting_a_parent_keeps_children_and_branches_are_independent(backend: Backend):
    store = backend.store
    await store.put_response(snap(ALICE, "p", "hi", '["u1"]', items=("u1",)))
    await asyncio.gather(  # two continuations of one parent at once
        store.put_response(snap(ALICE, "b1", "left", '["u1", "a1", "L"]', parent="p", items=("L",)),
                           create_only=True),
        store.put_response(snap(ALICE, "b2", "right", '["u1", "a1", "R"]', parent="p", items=("R",)),
                           create_only=True))
    assert (await store.get_response(ALICE, "p")).conversation_json == '["u1"]'
    assert await store.delete_response(ALICE, "p") is True
    assert await store.get_response(ALICE, "p") is None
    b1, b2 = await store.get_response(ALICE, "b1"), await store.get_response(ALICE, "b2")
    assert (b1.conversation_json, b2.conversation_json) == ('["u1", "a1", "L"]', '["u1", "a1", "R"]')
    assert b1.previous_response_id == "p" and b1.created_at > 0
    # A continuation of a branch whose parent is gone needs only the branch.
    await store.put_response(snap(ALICE, "c", "more", b1.conversation_json[:-1] + ', "x"]', parent="b1"))
    assert (await store.get_response(ALICE, "c")).conversation_json == '["u1", "a1", "L", "x"]'


# ---- runs ---------------------------------------------------------------------------------------

async def test_a_cancelled_run_stays_cancelled(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r", "queued"), owner="gw1", lease_s=30)
    await store.set_run_status(ALICE, "r", IN_PROGRESS, expected=[QUEUED])
    await store.finish_run(ALICE, "r", CANCELLED, response=snap(ALICE, "r", "cancelled"),  # from any replica
                           events=[pb.RunEvent(event_json='{"type": "cancelled"}', terminal=True)])
    # The owner, unaware, tries every way back (renew is how it learns to stop).
    attempts = [store.finish_run(ALICE, "r", COMPLETED, owner="gw1", response=snap(ALICE, "r", "done"),
                                 events=[ev(2, terminal=True)]),
                store.set_run_status(ALICE, "r", IN_PROGRESS),
                store.set_run_status(ALICE, "r", COMPLETED, expected=[IN_PROGRESS]),
                store.renew_run(ALICE, "r", "gw1", 30),
                store.append_events(ALICE, "r", [ev(2)], owner="gw1")]
    for attempt in attempts:
        with pytest.raises(ServiceError) as info:
            await attempt
        assert conflict_status(info.value) == (grpc.StatusCode.ABORTED, "RUN_STATUS_CANCELLED")
    stored = await store.get_response(ALICE, "r")
    assert stored.run.status == CANCELLED and '"cancelled"' in stored.response_json
    assert [e.event_json async for e in store.read_events(ALICE, "r")] == ['{"type": "cancelled"}']


async def test_a_finish_racing_a_cancel_has_one_winner(backend: Backend):
    store = backend.store
    for n in range(10):
        rid = f"race{n}"
        await store.create_run(snap(ALICE, rid, "queued"), status=IN_PROGRESS, owner="gw1", lease_s=30)
        await store.append_events(ALICE, rid, [ev(1), ev(2)], owner="gw1")
        done, cancel = await asyncio.gather(
            store.finish_run(ALICE, rid, COMPLETED, owner="gw1", response=snap(ALICE, rid, "done"),
                             events=[ev(3, '"completed"', terminal=True)]),
            store.finish_run(ALICE, rid, CANCELLED, response=snap(ALICE, rid, "cancelled"),
                             events=[pb.RunEvent(event_json='"cancelled"', terminal=True)]),
            return_exceptions=True)
        winner = "done" if isinstance(cancel, ServiceError) else "cancelled"
        loser = done if winner == "cancelled" else cancel
        assert isinstance(loser, ServiceError) and loser.code == grpc.StatusCode.ABORTED, (done, cancel)
        stored = await store.get_response(ALICE, rid)
        assert stored.run.status == (COMPLETED if winner == "done" else CANCELLED)
        assert f'"{winner}"' in stored.response_json
        log = [(e.sequence, e.event_json) async for e in store.read_events(ALICE, rid)]
        assert log[2:] == [(3, '"completed"' if winner == "done" else '"cancelled"')] and len(log) == 3


async def test_compare_and_set_reports_the_current_status(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    with pytest.raises(ServiceError) as info:
        await store.set_run_status(ALICE, "r", COMPLETED, expected=[IN_PROGRESS])
    assert conflict_status(info.value) == (grpc.StatusCode.ABORTED, "RUN_STATUS_QUEUED")
    assert info.value.metadata["owner"] == "gw1"
    record = await store.set_run_status(ALICE, "r", IN_PROGRESS, expected=[QUEUED], owner="gw2", lease_s=5)
    assert (record.status, record.owner, record.owner_expires_at) == (IN_PROGRESS, "gw2", backend.clock.now + 5)
    with pytest.raises(ServiceError):
        await store.renew_run(ALICE, "r", "gw1", 30)  # no longer the owner


async def test_create_run_refuses_a_taken_id_and_runs_are_scoped(backend: Backend):
    store = backend.store
    await store.put_response(snap(ALICE, "r"))
    with pytest.raises(ServiceError) as info:
        await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
    await store.create_run(snap(ALICE, "r2"), owner="gw1", lease_s=30)
    with pytest.raises(ServiceError) as info:
        await store.create_run(snap(ALICE, "r2"), owner="gw1", lease_s=30)
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert (await store.get_run(ALICE, "r2")).status == QUEUED


async def test_a_failed_finish_writes_nothing(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r", "running"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    await store.append_events(ALICE, "r", [ev(1), ev(2)], owner="gw1")
    # The snapshot and status are fine, the events leave a gap: the whole finish is refused.
    with pytest.raises(ServiceError) as info:
        await store.finish_run(ALICE, "r", COMPLETED, owner="gw1", response=snap(ALICE, "r", "final"),
                               events=[ev(4), ev(5, terminal=True)])
    assert info.value.code == grpc.StatusCode.ABORTED and info.value.metadata["last_sequence"] == "2"
    stored = await store.get_response(ALICE, "r")
    assert '"running"' in stored.response_json and stored.run.status == IN_PROGRESS
    assert await events_of(store, ALICE, "r") == [1, 2]
    # Retried correctly, it lands whole.
    await store.finish_run(ALICE, "r", COMPLETED, owner="gw1", response=snap(ALICE, "r", "final"),
                           events=[ev(3), ev(4, terminal=True)])
    stored = await store.get_response(ALICE, "r")
    assert '"final"' in stored.response_json and stored.run.status == COMPLETED and stored.run.last_sequence == 4
    assert stored.created_at == stored.run.created_at  # the final snapshot keeps the run's creation time


async def test_finish_of_a_deleted_run_does_not_resurrect_it(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    await store.delete_response(ALICE, "r")
    with pytest.raises(ServiceError) as info:
        await store.finish_run(ALICE, "r", COMPLETED, response=snap(ALICE, "r", "final"))
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert await store.get_response(ALICE, "r") is None and await store.get_run(ALICE, "r") is None


# ---- event logs ---------------------------------------------------------------------------------

async def test_appends_are_contiguous_and_a_retry_never_duplicates(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    assert await store.append_events(ALICE, "r", [ev(1), ev(2), ev(3)], owner="gw1") == 3
    for batch in ([ev(1), ev(2), ev(3)], [ev(3)], [ev(5)]):  # a retry (its reply was lost), overlap, gap
        with pytest.raises(ServiceError) as info:
            await store.append_events(ALICE, "r", batch, owner="gw1")
        assert info.value.code == grpc.StatusCode.ABORTED and info.value.metadata["last_sequence"] == "3"
    with pytest.raises(ServiceError):
        await store.append_events(ALICE, "r", [ev(4)], owner="gw2")  # not the owner
    assert await store.append_events(ALICE, "r", [pb.RunEvent(event_json="x")]) == 4  # numbered here
    await store.append_events(ALICE, "r", [ev(n) for n in range(5, 301)], owner="gw1")  # > one read batch
    await store.finish_run(ALICE, "r", COMPLETED, owner="gw1", events=[ev(301, terminal=True)])
    assert await events_of(store, ALICE, "r") == list(range(1, 302))
    assert await events_of(store, ALICE, "r", after=7) == list(range(8, 302))
    assert await events_of(store, ALICE, "r", after=300, follow=True) == [301]
    assert await events_of(store, ALICE, "r", after=301, follow=True) == []  # finished: nothing to wait for


async def test_follow_gets_later_events_once_and_ends_at_the_terminal(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    await store.append_events(ALICE, "r", [ev(1), ev(2)])
    got: list[int] = []
    first = asyncio.Event()

    async def follow() -> None:
        async for event in store.read_events(ALICE, "r", after=1, follow=True):
            got.append(event.sequence)
            first.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(first.wait(), 10)  # caught up on what was there; now waiting
    await store.append_events(ALICE, "r", [ev(3), ev(4)])
    await store.append_events(ALICE, "r", [ev(5)])
    await store.finish_run(ALICE, "r", COMPLETED, events=[ev(6, terminal=True)])
    await asyncio.wait_for(task, 10)
    assert got == [2, 3, 4, 5, 6]


async def test_follow_ends_when_the_run_finishes_without_a_terminal_event(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    task = asyncio.create_task(events_of(store, ALICE, "r", follow=True))
    await store.append_events(ALICE, "r", [ev(1)])
    await store.finish_run(ALICE, "r", CANCELLED)
    assert await asyncio.wait_for(task, 10) == [1]


async def test_a_follower_that_disconnects_resumes_after_what_it_saw(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    await store.append_events(ALICE, "r", [ev(1), ev(2), ev(3)], owner="gw1")
    seen: list[int] = []
    async for event in store.read_events(ALICE, "r", follow=True):
        seen.append(event.sequence)
        if event.sequence == 2:
            break  # the reader goes away mid-stream
    await store.append_events(ALICE, "r", [ev(4), ev(5)], owner="gw1")
    resumed = asyncio.create_task(events_of(store, ALICE, "r", after=seen[-1], follow=True))
    await store.append_events(ALICE, "r", [ev(6)], owner="gw1")
    await store.finish_run(ALICE, "r", COMPLETED, owner="gw1", events=[ev(7, terminal=True)])
    assert seen + await asyncio.wait_for(resumed, 10) == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("backend", WAKE_ON_DELETE, indirect=True)
async def test_follow_of_a_deleted_response_ends_not_found(backend: Backend):
    await backend.store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    backend.inner.follow_poll_s = 60  # the deletion's notification, not a poll, must end the follower
    waiting = watch_waits(backend.inner)
    task = asyncio.create_task(events_of(backend.store, ALICE, "r", follow=True))
    await asyncio.wait_for(waiting.wait(), 10)
    await backend.store.delete_response(ALICE, "r")
    with pytest.raises(ServiceError) as info:
        await asyncio.wait_for(task, 10)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


# ---- owner leases ---------------------------------------------------------------------------------

async def test_a_run_whose_owner_stopped_renewing_is_failed(backend: Backend):
    store, clock = backend.store, backend.clock
    await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=10, failure_event_json='{"type": "failed"}')
    await store.set_run_status(ALICE, "r", IN_PROGRESS, expected=[QUEUED])
    await store.append_events(ALICE, "r", [ev(1)])
    clock.now += 8
    await store.renew_run(ALICE, "r", "gw1", 10)  # lease now ends at +18
    clock.now += 9
    assert (await store.get_run(ALICE, "r")).status == IN_PROGRESS
    clock.now += 2  # +19: the owner is gone
    stored = await store.get_response(ALICE, "r")
    assert stored.run.status == FAILED and stored.run.detail == runs.LEASE_EXPIRED
    assert [(e.sequence, e.event_json, e.terminal) async for e in store.read_events(ALICE, "r")] == \
        [(1, '{"n": 1}', False), (2, '{"type": "failed"}', True)]
    with pytest.raises(ServiceError):  # the owner coming back cannot undo it
        await store.finish_run(ALICE, "r", COMPLETED, owner="gw1")


async def test_a_follower_notices_its_runs_owner_died(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=10)
    await store.append_events(ALICE, "r", [ev(1)], owner="gw1")
    waiting = watch_waits(backend.inner)
    follower = asyncio.create_task(events_of(store, ALICE, "r", follow=True))
    await asyncio.wait_for(waiting.wait(), 10)
    backend.clock.now += 11  # gw1 never renewed: the follower's next poll fails the run
    assert await asyncio.wait_for(follower, 10) == [1, 2]
    record = await store.get_run(ALICE, "r")
    assert record.status == FAILED and "lease expired" in record.detail


async def test_the_sweep_fails_expired_runs_and_wakes_followers(backend: Backend):
    store, clock = backend.store, backend.clock
    await store.create_run(snap(ALICE, "dead"), status=IN_PROGRESS, owner="gw1", lease_s=10)
    await store.create_run(snap(ALICE, "alive"), status=IN_PROGRESS, owner="gw2", lease_s=100)
    await store.create_run(snap(ALICE, "forever"), status=IN_PROGRESS)  # no lease
    backend.inner.follow_poll_s = 60  # the sweep's failure event, not a poll, must end the follower
    waiting = watch_waits(backend.inner)
    task = asyncio.create_task(events_of(store, ALICE, "dead", follow=True))
    await asyncio.wait_for(waiting.wait(), 10)
    clock.now += 11
    failed = await store.expire_runs()
    assert [r.key.response_id for r in failed] == ["dead"]
    assert await asyncio.wait_for(task, 10) == [1]  # the default failure event, terminal
    assert await store.expire_runs() == []
    assert (await store.get_run(ALICE, "alive")).status == IN_PROGRESS
    assert (await store.renew_run(ALICE, "alive", "gw2", 60)).status == IN_PROGRESS
    assert (await store.get_run(ALICE, "forever")).status == IN_PROGRESS


async def test_a_late_owner_may_finish_until_the_expiry_is_observed(backend: Backend):
    store = backend.store
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=10)
    backend.clock.now += 11  # nobody has read or swept it yet
    record = await store.finish_run(ALICE, "r", COMPLETED, owner="gw1", events=[ev(1, terminal=True)])
    assert record.status == COMPLETED and record.owner_expires_at == 0
    assert await store.expire_runs() == []
