"""The circuit breaker per worker endpoint: its states on a fake clock, and in the real edge (the
gateway harness) against a replica that really fails: its port closed, then serving again."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.breaker import EndpointBreaker
from tests.engine_double import ScriptedEngine, serve_worker
from tests.helpers import FakeClock
from tests.unit.gateway_harness import CHAT, MODEL, SCRIPT, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)
pytestmark = pytest.mark.timeout(60)


def test_n_consecutive_failures_open_it_a_success_resets_the_count():
    breaker = EndpointBreaker(threshold=3, cooldown_s=5, clock=FakeClock())
    breaker.failure("a")
    breaker.failure("a")
    breaker.success("a")  # not consecutive any more
    breaker.failure("a")
    breaker.failure("a")
    assert breaker.excluded() == set()
    breaker.failure("a")
    assert breaker.excluded() == {"a"} and breaker.is_open("a")


def test_the_calls_in_flight_when_a_failure_counted_fail_with_it_not_again():
    """One broken connection fails every call on it: the calls that began before the latest counted
    failure add nothing; a call made after it that fails is a failure of its own."""
    clock = FakeClock()
    breaker = EndpointBreaker(threshold=3, cooldown_s=5, clock=clock)
    clock.now = 10.0
    for started_at in (9.0, 9.5, 8.0, 10.0):  # on the connection that broke at 10
        breaker.failure("a", started_at)
    assert breaker._circuits["a"].failures == 1
    clock.now = 11.0
    breaker.failure("a", started_at=10.5)  # made after it, on a new connection, and failed too
    assert breaker._circuits["a"].failures == 2 and not breaker.is_open("a")
    clock.now = 12.0
    breaker.failure("a", started_at=11.5)
    assert breaker.is_open("a")


def test_after_the_cool_down_one_probe_decides():
    clock = FakeClock()
    breaker = EndpointBreaker(threshold=1, cooldown_s=5, clock=clock)
    breaker.failure("a")
    assert breaker.due_for_probe() == []  # cooling down
    clock.now += 5
    assert breaker.due_for_probe() == ["a"]
    assert breaker.due_for_probe() == [] and breaker.excluded() == {"a"}  # one probe at a time, still out
    breaker.probed("a", serving=False)  # another cool-down
    clock.now += 4.9
    assert breaker.due_for_probe() == []
    clock.now += 0.1
    assert breaker.due_for_probe() == ["a"]
    breaker.probed("a", serving=True)
    assert breaker.excluded() == set()
    breaker.keep_only([])  # an endpoint that left the routes is forgotten
    assert breaker.excluded() == set()


async def candidates(gateway: Gateway) -> list[str]:
    return await gateway.on_loop(lambda: [e.address for e in gateway.table.candidates(MODEL)])


async def until_candidates(gateway: Gateway, want: list[str], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sorted(await candidates(gateway)) != sorted(want):
        assert time.monotonic() < deadline, f"candidates never became {want}"
        await asyncio.sleep(0.05)


async def test_a_failing_replica_leaves_the_rotation_and_comes_back_after_a_probe(workers, gateway, oai):
    live, _ = workers
    flaky = await serve_worker(ScriptedEngine(SCRIPT))
    port = flaky.port
    await gateway.route(flaky.address, live.address)
    breaker = gateway.table.breaker
    breaker.cooldown_s = 0.3
    revived = None
    try:
        await flaky.server.stop(0)  # really gone: connections are refused
        for _ in range(breaker.threshold):  # the live one looks busier: the dead one is tried first each time
            await gateway.on_loop(lambda: setattr(gateway.endpoint(live.address), "outstanding", 1))
            try:
                reply = await oai.chat.completions.create(model=MODEL, messages=CHAT["messages"])
            finally:
                await gateway.on_loop(lambda: setattr(gateway.endpoint(live.address), "outstanding", 0))
            assert reply.choices[0].message.content == "Hello world!"  # retried on the live one
        assert await candidates(gateway) == [live.address]  # open
        # half-open after the cool-down: the probe (a health check) fails, so it stays out
        await asyncio.sleep(breaker.cooldown_s)  # the cool-down under test
        assert await candidates(gateway) == [live.address]
        await until_candidates(gateway, [live.address])
        assert breaker.is_open(flaky.address)
        # the replica serves again on the same address: the next probe lets it back in
        revived = await serve_worker(ScriptedEngine(SCRIPT), port=port)
        await until_candidates(gateway, [flaky.address, live.address])
        assert not breaker.is_open(flaky.address)
    finally:
        if revived is not None:
            await revived.server.stop(0)
