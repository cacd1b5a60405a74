"""Stored responses expire: a response, its run and its event log go `retention_s` after the last
write to any of them (30 days by default, as OpenAI keeps responses; MSHIP_STATE_RETENTION_S; 0
keeps them until deleted). memory:// drops them on its fake clock; Redis gives every key an expiry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from mship.state.v1 import state_pb2 as pb
from services.common.errors import ServiceError
from services.common.vocabulary import DEFAULT_STATE_RETENTION_S, ENV_STATE_RETENTION_S
from services.state.backends import open_store
from services.state.memory_store import MemoryStore
from services.state.redis_store import RedisStore, _keys
from tests.redis_server import RedisServer
from tests.store_contract import Clock, ev, snap

DAY = 24 * 3600.0


def test_the_default_is_30_days_and_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_STATE_RETENTION_S, raising=False)
    assert open_store("memory://").retention_s == DEFAULT_STATE_RETENTION_S == 30 * DAY
    monkeypatch.setenv(ENV_STATE_RETENTION_S, "3600")
    assert open_store("memory://").retention_s == 3600
    monkeypatch.setenv(ENV_STATE_RETENTION_S, "0")
    assert open_store("memory://").retention_s == 0
    for bad in ("-1", "30d", "inf", "nan"):
        monkeypatch.setenv(ENV_STATE_RETENTION_S, bad)
        with pytest.raises(ValueError, match=ENV_STATE_RETENTION_S):
            open_store("memory://")


async def test_memory_drops_a_response_retention_after_its_last_write():
    clock = Clock()
    store = MemoryStore(clock=clock, retention_s=DAY)
    await store.put_response(snap("alice", "old"))
    await store.create_run(snap("alice", "run"), owner="gw")  # no lease: only retention ends it
    clock.now += DAY - 10
    await store.append_events("alice", "run", [ev(1)], owner="gw")  # a write: the run's clock starts again
    assert await store.get_response("alice", "old") is not None
    clock.now += 10
    assert await store.get_response("alice", "old") is None
    assert (await store.get_response("alice", "run")).run.last_sequence == 1
    await store.finish_run("alice", "run", pb.RUN_STATUS_COMPLETED, owner="gw", events=[ev(2, terminal=True)])
    clock.now += DAY
    assert await store.get_response("alice", "run") is None and await store.get_run("alice", "run") is None
    assert not store._responses and not store._runs and not store._logs and not store._written


async def test_a_follower_of_an_expired_run_ends_not_found():
    clock = Clock()
    store = MemoryStore(clock=clock, retention_s=DAY, follow_poll_s=0.01)
    await store.create_run(snap("alice", "r"), owner="gw")  # no lease: nothing fails it meanwhile

    async def follow() -> list[int]:
        return [e.sequence async for e in store.read_events("alice", "r", follow=True)]
    follower = asyncio.ensure_future(follow())
    await asyncio.sleep(0.05)
    clock.now += DAY
    await store.put_response(snap("bob", "other"))  # any operation drops what expired
    with pytest.raises(ServiceError) as info:
        await asyncio.wait_for(follower, 5)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


async def test_retention_0_keeps_responses_until_deleted():
    clock = Clock()
    store = MemoryStore(clock=clock, retention_s=0)
    await store.put_response(snap("alice", "r"))
    clock.now += 10_000 * DAY
    assert await store.get_response("alice", "r") is not None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("retention-redis")))
    yield server
    server.stop()


@pytest.mark.integration
async def test_redis_gives_every_key_of_a_response_an_expiry(redis_server: RedisServer):
    raw = redis.Redis(host="127.0.0.1", port=redis_server.port)
    store = RedisStore(redis_server.url, retention_s=DAY)
    try:
        await store.put_response(snap("alice", "plain"))
        assert 0 < raw.pttl(_keys("alice", "plain")[0]) <= DAY * 1000
        await store.create_run(snap("alice", "run"), owner="gw", lease_s=30)
        raw.persist(_keys("alice", "run")[0])  # each write sets the expiry of all three again
        await store.append_events("alice", "run", [ev(1)], owner="gw")
        await store.finish_run("alice", "run", pb.RUN_STATUS_COMPLETED, owner="gw", events=[ev(2, terminal=True)])
        assert all(0 < raw.pttl(key) <= DAY * 1000 for key in _keys("alice", "run"))
        kept = RedisStore(redis_server.url, retention_s=0)
        await kept.put_response(snap("alice", "kept"))
        assert raw.pttl(_keys("alice", "kept")[0]) == -1  # no expiry
        await kept.close()
        short = RedisStore(redis_server.url, retention_s=0.1)
        await short.put_response(snap("alice", "brief"))
        await asyncio.sleep(0.3)
        assert await short.get_response("alice", "brief") is None
        await short.close()
    finally:
        raw.close()
        await store.close()
