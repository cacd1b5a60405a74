"""The state store's rules on the memory backend (fast, with a fake clock): identity scoping,
self-contained snapshots, compare-and-set runs, atomic finish, event logs, owner lease expiry.
The Redis backend applies the same rules (services/state/runs.py); tests/integration covers it."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from mship.state.v1 import state_pb2 as pb
from services.common.errors import ServiceError
from services.state import runs
from services.state.memory_store import MemoryStore
from services.state.servicer import page_items
from services.state.store import key_path, parse_key_path

ALICE, BOB = "alice", "bob"
QUEUED, IN_PROGRESS, COMPLETED = pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_IN_PROGRESS, pb.RUN_STATUS_COMPLETED
CANCELLED, FAILED = pb.RUN_STATUS_CANCELLED, pb.RUN_STATUS_FAILED


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock, follow_poll_s=0.05)


def snap(identity: str, rid: str, text: str = "", conversation: str = "[]", parent: str = "",
         items: tuple[str, ...] = ()) -> pb.StoredResponse:
    return pb.StoredResponse(key=pb.ResponseKey(identity=identity, response_id=rid), previous_response_id=parent,
                             response_json=f'{{"id": "{rid}", "text": "{text}"}}', conversation_json=conversation,
                             input_items=[pb.InputItem(id=i, item_json=f'{{"id": "{i}"}}') for i in items])


def ev(seq: int, text: str = "", terminal: bool = False) -> pb.RunEvent:
    return pb.RunEvent(sequence=seq, event_json=text or f'{{"n": {seq}}}', terminal=terminal)


async def events_of(store: MemoryStore, identity: str, rid: str, after: int = 0) -> list[int]:
    return [e.sequence async for e in store.read_events(identity, rid, after)]


def code_of(info: pytest.ExceptionInfo[ServiceError]) -> tuple[grpc.StatusCode, str]:
    return info.value.code, pb.RunStatus.Name(pb.RunStatus.Value(info.value.metadata["status"])) \
        if "status" in info.value.metadata else ""


# ---- responses ------------------------------------------------------------------------------------

async def test_another_identity_sees_nothing(store: MemoryStore):
    await store.put_response(snap(ALICE, "r1", "secret"))
    assert await store.get_response(BOB, "r1") is None
    assert await store.delete_response(BOB, "r1") is False
    assert (await store.get_response(ALICE, "r1")).response_json.endswith('"secret"}')


def test_key_parts_are_encoded_so_identities_never_collide():
    assert key_path("a/b", "c") != key_path("a", "b/c")
    assert parse_key_path(key_path("a/b", "c%2F")) == ("a/b", "c%2F")


async def test_slash_in_identity_cannot_reach_another_identity(store: MemoryStore):
    await store.put_response(snap("a", "b/c", "mine"))
    assert await store.get_response("a/b", "c") is None


async def test_create_only_refuses_a_taken_id(store: MemoryStore, clock: Clock):
    await store.put_response(snap(ALICE, "r1", "first"), create_only=True)
    with pytest.raises(ServiceError) as info:
        await store.put_response(snap(ALICE, "r1", "second"), create_only=True)
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
    stored = await store.get_response(ALICE, "r1")
    assert '"first"' in stored.response_json and stored.created_at == clock.now


async def test_deleting_a_parent_keeps_its_child_whole(store: MemoryStore):
    await store.put_response(snap(ALICE, "p", "hi", conversation='["u1"]'))
    await store.put_response(snap(ALICE, "c", "there", conversation='["u1", "a1", "u2"]', parent="p"))
    assert await store.delete_response(ALICE, "p") is True
    assert await store.get_response(ALICE, "p") is None
    child = await store.get_response(ALICE, "c")
    assert child.conversation_json == '["u1", "a1", "u2"]' and child.previous_response_id == "p"


async def test_two_continuations_of_one_parent_are_independent(store: MemoryStore):
    await store.put_response(snap(ALICE, "p", conversation='["u1"]'))
    await asyncio.gather(store.put_response(snap(ALICE, "b1", "left", '["u1", "L"]', parent="p")),
                         store.put_response(snap(ALICE, "b2", "right", '["u1", "R"]', parent="p")))
    b1, b2 = await store.get_response(ALICE, "b1"), await store.get_response(ALICE, "b2")
    assert (b1.conversation_json, b2.conversation_json) == ('["u1", "L"]', '["u1", "R"]')
    assert (await store.get_response(ALICE, "p")).conversation_json == '["u1"]'


def test_input_items_pages_like_the_api():
    items = [pb.InputItem(id=f"i{n}") for n in range(5)]
    first = page_items(items, 2, pb.LIST_ORDER_UNSPECIFIED, "")  # desc by default
    assert [i.id for i in first.data] == ["i4", "i3"] and first.has_more and first.last_id == "i3"
    rest = page_items(items, 10, pb.LIST_ORDER_DESC, first.last_id)
    assert [i.id for i in rest.data] == ["i2", "i1", "i0"] and not rest.has_more
    asc = page_items(items, 2, pb.LIST_ORDER_ASC, "i2")
    assert [i.id for i in asc.data] == ["i3", "i4"] and not asc.has_more and asc.first_id == "i3"
    with pytest.raises(ServiceError) as info:
        page_items(items, 2, pb.LIST_ORDER_ASC, "nope")
    assert info.value.field_violations[0][0] == "after"


# ---- runs ---------------------------------------------------------------------------------------

async def test_a_cancelled_run_stays_cancelled(store: MemoryStore):
    await store.create_run(snap(ALICE, "r", "queued"), owner="gw1", lease_s=30)
    await store.set_run_status(ALICE, "r", IN_PROGRESS, expected=[QUEUED])
    await store.finish_run(ALICE, "r", CANCELLED, response=snap(ALICE, "r", "cancelled"),
                           events=[pb.RunEvent(event_json='{"type": "cancelled"}', terminal=True)])
    # The owner, unaware, tries every way back.
    attempts = [store.finish_run(ALICE, "r", COMPLETED, owner="gw1", response=snap(ALICE, "r", "done"),
                                 events=[ev(2, terminal=True)]),
                store.set_run_status(ALICE, "r", IN_PROGRESS),
                store.set_run_status(ALICE, "r", COMPLETED, expected=[IN_PROGRESS]),
                store.renew_run(ALICE, "r", "gw1", 30),
                store.append_events(ALICE, "r", [ev(2)], owner="gw1")]
    for attempt in attempts:
        with pytest.raises(ServiceError) as info:
            await attempt
        assert code_of(info) == (grpc.StatusCode.ABORTED, "RUN_STATUS_CANCELLED")
    stored = await store.get_response(ALICE, "r")
    assert stored.run.status == CANCELLED and '"cancelled"' in stored.response_json
    assert [e.event_json async for e in store.read_events(ALICE, "r")] == ['{"type": "cancelled"}']


async def test_compare_and_set_reports_the_current_status(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    with pytest.raises(ServiceError) as info:
        await store.set_run_status(ALICE, "r", COMPLETED, expected=[IN_PROGRESS])
    assert code_of(info) == (grpc.StatusCode.ABORTED, "RUN_STATUS_QUEUED")
    assert info.value.metadata["owner"] == "gw1"
    record = await store.set_run_status(ALICE, "r", IN_PROGRESS, expected=[QUEUED], owner="gw2", lease_s=5)
    assert (record.status, record.owner, record.owner_expires_at) == (IN_PROGRESS, "gw2", 1_005.0)
    with pytest.raises(ServiceError):
        await store.renew_run(ALICE, "r", "gw1", 30)  # no longer the owner


async def test_create_run_refuses_a_taken_id_and_runs_are_scoped(store: MemoryStore):
    await store.put_response(snap(ALICE, "r"))
    with pytest.raises(ServiceError) as info:
        await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS
    await store.create_run(snap(ALICE, "r2"), owner="gw1", lease_s=30)
    assert await store.get_run(BOB, "r2") is None
    with pytest.raises(ServiceError) as info:
        await store.finish_run(BOB, "r2", CANCELLED)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert (await store.get_run(ALICE, "r2")).status == QUEUED


async def test_a_failed_finish_writes_nothing(store: MemoryStore):
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


async def test_finish_of_a_deleted_run_does_not_resurrect_it(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), owner="gw1", lease_s=30)
    await store.delete_response(ALICE, "r")
    with pytest.raises(ServiceError) as info:
        await store.finish_run(ALICE, "r", COMPLETED, response=snap(ALICE, "r", "final"))
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert await store.get_response(ALICE, "r") is None


# ---- event logs ---------------------------------------------------------------------------------

async def test_appends_are_contiguous_and_a_retry_never_duplicates(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    assert await store.append_events(ALICE, "r", [ev(1), ev(2), ev(3)], owner="gw1") == 3
    for batch in ([ev(1), ev(2), ev(3)], [ev(3)], [ev(5)]):  # retry, overlap, gap
        with pytest.raises(ServiceError) as info:
            await store.append_events(ALICE, "r", batch, owner="gw1")
        assert info.value.code == grpc.StatusCode.ABORTED and info.value.metadata["last_sequence"] == "3"
    with pytest.raises(ServiceError):
        await store.append_events(ALICE, "r", [ev(4)], owner="gw2")  # not the owner
    assert await store.append_events(ALICE, "r", [pb.RunEvent(event_json="x")]) == 4  # numbered here
    assert await events_of(store, ALICE, "r") == [1, 2, 3, 4]
    assert await events_of(store, ALICE, "r", after=2) == [3, 4]
    assert await events_of(store, ALICE, "r", after=4) == []


async def test_follow_gets_later_events_once_and_ends_at_the_terminal(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    await store.append_events(ALICE, "r", [ev(1), ev(2)])
    got: list[int] = []
    first = asyncio.Event()

    async def follow() -> None:
        async for event in store.read_events(ALICE, "r", after=1, follow=True):
            got.append(event.sequence)
            first.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(first.wait(), 5)  # caught up on what was there; now waiting
    await store.append_events(ALICE, "r", [ev(3), ev(4)])
    await store.append_events(ALICE, "r", [ev(5)])
    await store.finish_run(ALICE, "r", COMPLETED, events=[ev(6, terminal=True)])
    await asyncio.wait_for(task, 5)
    assert got == [2, 3, 4, 5, 6]


async def test_follow_ends_when_the_run_finishes_without_a_terminal_event(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    task = asyncio.create_task(events_of_follow(store, "r"))
    await store.append_events(ALICE, "r", [ev(1)])
    await store.finish_run(ALICE, "r", CANCELLED)
    assert await asyncio.wait_for(task, 5) == [1]


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


async def events_of_follow(store: MemoryStore, rid: str) -> list[int]:
    return [e.sequence async for e in store.read_events(ALICE, rid, follow=True)]


async def test_follow_of_a_deleted_response_ends_not_found(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    store.follow_poll_s = 60  # the deletion's notification, not a poll, must end the follower
    task = asyncio.create_task(events_of_follow(store, "r"))
    await until(lambda: (ALICE, "r") in store._changed)  # it is waiting
    await store.delete_response(ALICE, "r")
    with pytest.raises(ServiceError) as info:
        await asyncio.wait_for(task, 5)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


async def test_reading_another_identitys_log_is_not_found(store: MemoryStore):
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=30)
    await store.append_events(ALICE, "r", [ev(1)])
    with pytest.raises(ServiceError) as info:
        await events_of(store, BOB, "r")
    assert info.value.code == grpc.StatusCode.NOT_FOUND


# ---- owner leases ---------------------------------------------------------------------------------

async def test_a_run_whose_owner_stopped_renewing_is_failed(store: MemoryStore, clock: Clock):
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


async def test_the_sweep_fails_expired_runs_and_wakes_followers(store: MemoryStore, clock: Clock):
    await store.create_run(snap(ALICE, "dead"), status=IN_PROGRESS, owner="gw1", lease_s=10)
    await store.create_run(snap(ALICE, "alive"), status=IN_PROGRESS, owner="gw2", lease_s=100)
    await store.create_run(snap(ALICE, "forever"), status=IN_PROGRESS)  # no lease
    store.follow_poll_s = 60  # the sweep's notification, not a poll, must end the follower
    task = asyncio.create_task(events_of_follow(store, "dead"))
    await until(lambda: (ALICE, "dead") in store._changed)  # it is waiting
    clock.now += 11
    failed = await store.expire_runs()
    assert [r.key.response_id for r in failed] == ["dead"]
    assert await asyncio.wait_for(task, 5) == [1]  # the default failure event, terminal
    assert await store.expire_runs() == []
    assert (await store.get_run(ALICE, "alive")).status == IN_PROGRESS
    assert (await store.get_run(ALICE, "forever")).status == IN_PROGRESS


async def test_a_late_owner_may_finish_until_the_expiry_is_observed(store: MemoryStore, clock: Clock):
    await store.create_run(snap(ALICE, "r"), status=IN_PROGRESS, owner="gw1", lease_s=10)
    clock.now += 11  # nobody has read or swept it yet
    record = await store.finish_run(ALICE, "r", COMPLETED, owner="gw1", events=[ev(1, terminal=True)])
    assert record.status == COMPLETED and record.owner_expires_at == 0
    assert await store.expire_runs() == []


def test_event_shape_rules():
    assert runs.validate_events([ev(1), ev(2)], "events", allow_terminal=False) == []
    assert runs.validate_events([ev(1), ev(3)], "events", allow_terminal=False)[0][0] == "events[1].sequence"
    assert runs.validate_events([ev(1), ev(0)], "events", allow_terminal=False)[0][0] == "events"
    assert runs.validate_events([ev(1, terminal=True)], "events", allow_terminal=False)
    assert runs.validate_events([ev(1, terminal=True), ev(2)], "events", allow_terminal=True)
    assert runs.validate_events([ev(1), ev(2, terminal=True)], "events", allow_terminal=True) == []
