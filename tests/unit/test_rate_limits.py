"""Rate-limit arithmetic and its stores: token buckets in memory and in a real Redis (the Lua
scripts every gateway replica shares), overrides from MSHIP_RATE_LIMITS_FILE, and admission's
reservation being settled against real usage. A fake clock drives the memory store; Redis runs on
its own clock, so its tests use limits whose refill within a test is negligible."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as wpb
from services.common.routes import RouteTable
from services.gateway.admission import buckets
from services.gateway.admission.admission import Admission, duration, estimate_tokens
from services.gateway.admission.buckets import Bucket, MemoryBuckets
from services.gateway.admission.overrides import RateLimitOverrides, parse_overrides
from services.gateway.admission.redis_buckets import RedisBuckets
from services.gateway.identity import Caller
from services.gateway.protocol_common.openai_error import OpenAIError
from tests.helpers import FakeClock
from tests.redis_server import RedisServer


def test_reset_times_are_written_as_openai_writes_them():
    assert [duration(s) for s in (0, 0.0174, 1, 1.5, 59.9994, 60, 360, 61.25)] == [
        "0s", "17ms", "1s", "1.5s", "59.999s", "1m0s", "6m0s", "1m1.25s"]


async def test_a_bucket_allows_a_burst_of_its_limit_then_one_per_refill():
    clock = FakeClock()
    store = MemoryBuckets(clock)
    limit = 6  # one back every 10 s
    for i in range(limit):
        granted, (draw,) = await store.take([Bucket("k", limit, 1)])
        assert granted and draw.remaining == limit - 1 - i
    granted, (draw,) = await store.take([Bucket("k", limit, 1)])
    assert not granted and draw.remaining == 0 and draw.retry_after_s == pytest.approx(10)
    assert draw.reset_s == pytest.approx(60)
    clock.now += 9.9
    assert not (await store.take([Bucket("k", limit, 1)]))[0]
    clock.now += 0.2
    assert (await store.take([Bucket("k", limit, 1)]))[0]
    clock.now += 600  # the window resets: a full burst again, never more
    results = [(await store.take([Bucket("k", limit, 1)]))[0] for _ in range(limit + 1)]
    assert results == [True] * limit + [False]


async def test_a_take_is_all_or_nothing_across_buckets():
    store = MemoryBuckets(FakeClock())
    granted, (requests, tokens) = await store.take([Bucket("r", 10, 1), Bucket("t", 100, 101)])
    assert not granted and requests.remaining == 10 and tokens.retry_after_s > 0
    granted, (requests, tokens) = await store.take([Bucket("r", 10, 1), Bucket("t", 100, 60)])
    assert granted and (requests.remaining, tokens.remaining) == (9, 40)


async def test_adjusting_gives_back_and_charges_without_passing_the_limit():
    store = MemoryBuckets(FakeClock())
    await store.take([Bucket("t", 100, 80)])
    await store.adjust("t", 100, +50)  # reserved 80, used 30
    granted, (draw,) = await store.take([Bucket("t", 100, 70)])
    assert granted and draw.level == 0
    await store.adjust("t", 100, +500)  # never above the limit
    assert (await store.take([Bucket("t", 100, 100)]))[0]
    await store.adjust("t", 100, -40)  # used 40 more than reserved: debt
    granted, (draw,) = await store.take([Bucket("t", 100, 1)])
    assert not granted and draw.level == pytest.approx(-40)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(Path(tmp_path_factory.mktemp("rate-redis")))
    yield server.url
    server.stop()


async def test_redis_buckets_are_one_budget_for_every_replica(redis_url):
    """Two stores (two gateway replicas) on one Redis: the limit holds across them, all or nothing."""
    a, b = RedisBuckets(redis_url), RedisBuckets(redis_url)
    key = f"shared-{os.getpid()}-{id(a)}"
    try:
        results = await asyncio.gather(*[(a if i % 2 else b).take([Bucket(key, 5, 1)]) for i in range(8)])
        assert sorted(granted for granted, _ in results) == [False] * 3 + [True] * 5
        granted, (draw,) = await a.take([Bucket(key, 5, 1)])
        assert not granted and draw.retry_after_s == pytest.approx(12, abs=0.5)
        granted, _ = await b.take([Bucket(key + "r", 5, 1), Bucket(key + "t", 50, 51)])
        assert not granted
        granted, (requests, tokens) = await b.take([Bucket(key + "r", 5, 1), Bucket(key + "t", 50, 20)])
        assert granted and requests.remaining == 4 and tokens.remaining == 30  # the refused take spent nothing
        await a.adjust(key + "t", 50, 15)
        granted, (tokens,) = await b.take([Bucket(key + "t", 50, 45)])
        assert granted and tokens.remaining == 0
    finally:
        await a.close()
        await b.close()


def test_overrides_file_field_by_field_and_reloaded(tmp_path):
    path = tmp_path / "limits.yaml"
    path.write_text('team-a:\n  "*": {requests_per_minute: 100}\n  tiny: {tokens_per_minute: 500}\n')
    overrides = RateLimitOverrides(str(path))
    assert overrides.limits("team-a", "tiny", (10, 1000)) == (100, 500)
    assert overrides.limits("team-a", "other", (10, 1000)) == (100, 1000)
    assert overrides.limits("team-b", "tiny", (10, 1000)) == (10, 1000)
    path.write_text("team-b:\n  tiny: {requests_per_minute: 0}\n# longer now, so the stamp changes\n")
    overrides._file.check_now()  # the next lookup looks at the file (normally at most once a second)
    assert overrides.limits("team-b", "tiny", (10, 1000)) == (0, 1000)
    path.write_text("team-b: [not, a, mapping]\n")
    overrides._file.check_now()
    assert overrides.limits("team-b", "tiny", (10, 1000)) == (0, 1000)  # a broken file keeps the last good table
    path.write_text("team-b: [unclosed\n")
    overrides._file.check_now()
    assert overrides.limits("team-b", "tiny", (10, 1000)) == (0, 1000)  # so does one that is not YAML
    for bad in ({"a": {"m": {"rpm": 1}}}, {"a": {"m": {"requests_per_minute": -1}}}, {"a": 3}, [1]):
        with pytest.raises(ValueError):
            parse_overrides(bad, "limits.yaml")


def routed_table(rpm: int = 0, tpm: int = 0) -> RouteTable:
    table = RouteTable()
    snapshot = cpb.RoutingSnapshot(version=1)
    model = snapshot.models.add(name="m", version="v1", max_model_len=4096, usecase=common_pb2.USECASE_GENERATE)
    model.rate_limits.requests_per_minute, model.rate_limits.tokens_per_minute = rpm, tpm
    table.apply(snapshot)
    return table


async def test_admission_reserves_then_settles_with_the_real_usage():
    clock = FakeClock()
    store = MemoryBuckets(clock)
    admission = Admission(routed_table(tpm=1000), store)
    caller = Caller("team-a")
    ticket = await admission.admit(caller, "m", prompt_bytes=400, max_tokens=500)
    assert ticket.reserved == estimate_tokens(400) + 500 == 600
    assert caller.response_headers["x-ratelimit-remaining-tokens"] == "400"
    with pytest.raises(OpenAIError) as refused:
        await admission.admit(Caller("team-a"), "m", prompt_bytes=400, max_tokens=500)
    assert (refused.value.status, refused.value.code, refused.value.type) == (429, "rate_limit_exceeded", "tokens")
    assert int(refused.value.headers["Retry-After"]) >= 12
    ticket.settle(150)  # the response used 150: 450 come back
    ticket.settle(0)    # once only
    await admission.settled()
    other = Caller("team-a")
    await admission.admit(other, "m", prompt_bytes=400, max_tokens=500)
    assert other.response_headers["x-ratelimit-remaining-tokens"] == "250"
    # another identity, and an anonymous caller at another address, have budgets of their own
    assert (await admission.admit(Caller("team-b"), "m", prompt_bytes=4, max_tokens=900)).reserved == 901
    await admission.admit(Caller("anonymous", "10.0.0.1", anonymous=True), "m", prompt_bytes=4, max_tokens=900)
    await admission.admit(Caller("anonymous", "10.0.0.2", anonymous=True), "m", prompt_bytes=4, max_tokens=900)


async def test_admission_with_no_limit_touches_no_store():
    class Exploding(MemoryBuckets):
        async def take(self, buckets):
            raise AssertionError("no limit: no store call")

    caller = Caller("team-a")
    ticket = await Admission(routed_table(), Exploding()).admit(caller, "m", prompt_bytes=10, max_tokens=None)
    assert not ticket.counts_tokens and caller.response_headers == {}


async def test_a_request_larger_than_the_bucket_waits_for_a_full_bucket_instead_of_never():
    admission = Admission(routed_table(tpm=100), MemoryBuckets(FakeClock()))
    ticket = await admission.admit(Caller("a"), "m", prompt_bytes=4000, max_tokens=None)
    assert ticket.reserved == 100


async def test_a_failing_store_admits():
    class Down(MemoryBuckets):
        async def take(self, buckets):
            raise ConnectionError("redis is down")

    ticket = await Admission(routed_table(rpm=1), Down()).admit(Caller("a"), "m", prompt_bytes=1, max_tokens=1)
    assert not ticket.counts_tokens


async def test_each_of_n_choices_reserves_its_max_tokens():
    """n choices may each use max_tokens: reserving one choice's worth would admit n times the limit
    at once (the debt settled afterwards comes after the hardware has done the work)."""
    def request(n: int, max_tokens: int | None = None) -> wpb.InferRequest:
        return wpb.InferRequest(sampling=wpb.SamplingParams(max_tokens=max_tokens, n=n))

    admission = Admission(routed_table(tpm=1000), MemoryBuckets(FakeClock()))
    ticket = await admission.admit_generation(Caller("a"), "m", 400, request(4, 100))
    assert ticket.reserved == estimate_tokens(400) + 4 * 100 == 500
    with pytest.raises(OpenAIError) as refused:  # 500 left: 100 + 5 x 100 does not fit
        await admission.admit_generation(Caller("a"), "m", 400, request(5, 100))
    assert refused.value.status == 429 and refused.value.type == "tokens"
    roomy = Admission(routed_table(tpm=100_000), MemoryBuckets(FakeClock()))
    assert (await roomy.admit_generation(Caller("b"), "m", 4, request(2))).reserved == 1 + 2 * 1024  # the default each


async def test_many_live_identities_do_not_make_every_take_scan_them_all(monkeypatch):
    """Past PRUNE_AT live buckets (one per identity, or per client address when anonymous), a take
    must not look at every bucket each time: that is quadratic in the identities."""
    monkeypatch.setattr(buckets, "PRUNE_AT", 100)
    looked = 0
    real_refill = buckets.refill

    def counting(level: float, elapsed_s: float, limit: int) -> float:
        nonlocal looked
        looked += 1
        return real_refill(level, elapsed_s, limit)

    monkeypatch.setattr(buckets, "refill", counting)
    store = MemoryBuckets(FakeClock())  # the clock stands still: no bucket refills, none is pruned
    for i in range(2000):
        assert (await store.take([Bucket(f"identity-{i}", 10, 1)]))[0]
    assert looked < 6 * 2000, looked  # amortized: a few looks per take, not one per live bucket


def test_an_overrides_file_caught_empty_keeps_its_limits(tmp_path):
    """An editor or `>` truncates the file before writing it: for that moment the overrides (here a
    lower limit) must not be lifted."""
    path = tmp_path / "limits.yaml"
    path.write_text('team-a:\n  "*": {requests_per_minute: 1}\n')
    overrides = RateLimitOverrides(str(path))
    assert overrides.limits("team-a", "m", (100, 0)) == (1, 0)
    path.write_text("")
    overrides._file.check_now()
    assert overrides.limits("team-a", "m", (100, 0)) == (1, 0)
    path.write_text("# no overrides\n")  # nothing, said on purpose
    overrides._file.check_now()
    assert overrides.limits("team-a", "m", (100, 0)) == (100, 0)


async def test_an_anonymous_ipv6_client_has_one_budget_for_its_whole_64():
    """One host holds a /64: a budget per IPv6 address would let it pick a fresh one per request."""
    admission = Admission(routed_table(rpm=1), MemoryBuckets(FakeClock()))
    await admission.admit(Caller("anonymous", "2001:db8:1:2::1", anonymous=True), "m", prompt_bytes=1, max_tokens=1)
    with pytest.raises(OpenAIError) as refused:
        await admission.admit(Caller("anonymous", "2001:db8:1:2:ffff::9", anonymous=True), "m",
                              prompt_bytes=1, max_tokens=1)
    assert refused.value.status == 429
    for other in ("2001:db8:1:3::1", "10.0.0.1"):  # another /64, an IPv4 client: budgets of their own
        await admission.admit(Caller("anonymous", other, anonymous=True), "m", prompt_bytes=1, max_tokens=1)
    await admission.admit(Caller("anonymous", "::ffff:10.0.0.2", anonymous=True), "m", prompt_bytes=1, max_tokens=1)
    with pytest.raises(OpenAIError):  # an IPv4-mapped address is its IPv4 client
        await admission.admit(Caller("anonymous", "10.0.0.2", anonymous=True), "m", prompt_bytes=1, max_tokens=1)
