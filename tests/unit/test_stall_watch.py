"""A hung engine (alive, no progress, requests in it) is killed by the replica's health check and
its requests fail as they do when an engine crashes; an engine that shows progress, or is idle, is
left alone. The real servicer and health check on a real grpc.aio server, an engine double that
hangs, a clock the test moves. (Real engines, hung by SIGSTOP: tests/integration/test_resilience.py.)"""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import ErrorDetails
from services.worker import host as host_module
from services.worker.engine import EngineStats, Prompt
from services.worker.host import ModelHost
from services.worker.sampling import sampling_from_request
from services.worker.stall_watch import DEFAULT_STALL_TIMEOUT_S, StallWatch
from tests.engine_double import AudioDouble, ScriptedEngine, serve_worker
from tests.helpers import until
from tests.worker_calls import chat, collect

LIMIT_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HungEngine(ScriptedEngine):
    """Takes a request and never answers it, until killed: then it is a crashed engine (errored,
    its streams fail). `answers` is what its probe says; `steps_at` the last step it reports."""

    def __init__(self, *, killable: bool = True, answers: bool = False) -> None:
        super().__init__(["never"])
        self.first_hold.clear()
        self.killable, self.answers = killable, answers
        self.kills = self.probes = 0
        self.steps_at = 0.0
        self.dead = False
        self.render_hangs = False

    async def render(self, req):
        if not self.render_hangs:
            return await super().render(req)
        self.renders.append(req)
        await self.first_hold.wait()  # llama.cpp renders on its server: a hung one never answers
        raise RuntimeError("the engine's connection closed")

    def kill(self) -> None:
        self.kills += 1
        if self.killable:
            self.dead = self.fail = True
            self.first_hold.set()  # what was waiting fails at once

    async def answers_probe(self) -> bool:
        self.probes += 1
        return self.answers

    def stats(self) -> EngineStats:
        return EngineStats(last_step_at=self.steps_at)

    @property
    def errored(self) -> bool:
        return self.dead


@pytest.fixture
def hung(served):
    """Serve `engine` with a stall watch on the test's clock: (stub, host, clock)."""
    async def start(engine: HungEngine):
        stub = await served(engine)
        host, clock = served.workers[-1].servicer.host, Clock()
        host.watch = StallWatch(LIMIT_S, clock=clock)
        return stub, host, clock
    return start


async def in_engine(stub, engine: HungEngine, request_id: str = "r1") -> asyncio.Future:
    call = asyncio.ensure_future(collect(stub, chat("hi", model="m", request_id=request_id)))
    await until(lambda: request_id in engine.started, "the request reached the engine")
    return call


def reason(error: BaseException) -> tuple[grpc.StatusCode, str]:
    assert isinstance(error, grpc.aio.AioRpcError), error
    d = ErrorDetails.from_rpc_error(error)
    return d.code, d.reason


async def test_a_hung_engine_is_killed_and_its_requests_fail_as_for_a_crash(hung):
    engine = HungEngine()
    stub, host, clock = await hung(engine)
    clock.now += 10 * LIMIT_S  # idle: however long, not a stall
    assert await host.check() and engine.kills == engine.probes == 0
    call = await in_engine(stub, engine)
    clock.now += LIMIT_S - 1
    assert await host.check() and engine.kills == 0  # quiet, but not for the limit yet
    clock.now += 2
    assert not await host.check()
    assert (engine.probes, engine.kills) == (1, 1)
    assert host.phase == pb.LOAD_PHASE_FAILED and "engine hung" in host.history.events[-1].message
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call, 5)
    assert reason(info.value) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_DIED")  # retryable elsewhere
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat("again", model="m"))
    assert reason(info.value) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_DIED")
    assert not await host.check() and engine.kills == 1  # once


async def test_an_engine_in_this_process_is_marked_failed_so_new_requests_go_elsewhere(hung):
    """llama.cpp in the worker's own process: nothing to kill; the replica is failed (Serve replaces
    it) and refuses new requests as a dead engine's, though the engine itself never says it died."""
    engine = HungEngine(killable=False)
    stub, host, clock = await hung(engine)
    call = await in_engine(stub, engine)
    clock.now += LIMIT_S + 1
    assert not await host.check() and engine.kills == 1 and not engine.errored
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat("again", model="m"))
    assert reason(info.value) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_DIED")
    call.cancel()


async def test_an_engine_whose_loop_answers_is_busy_not_hung(hung):
    """One long prompt: no step to see for the limit, but llama-server's loop answers its probe
    between two batches. That counts as progress for another limit's worth."""
    engine = HungEngine(answers=True)
    stub, host, clock = await hung(engine)
    call = await in_engine(stub, engine)
    clock.now += LIMIT_S + 1
    assert await host.check() and (engine.probes, engine.kills) == (1, 0)
    clock.now += LIMIT_S - 1
    assert await host.check() and engine.probes == 1  # not asked again before another limit
    engine.answers = False
    clock.now += 2
    assert not await host.check() and (engine.probes, engine.kills) == (2, 1)
    with pytest.raises(grpc.aio.AioRpcError):
        await asyncio.wait_for(call, 5)


async def test_steps_and_ended_requests_are_progress(hung):
    engine = HungEngine()
    stub, host, clock = await hung(engine)
    call = await in_engine(stub, engine)
    for _ in range(3):  # the engine reports steps (vLLM's, a chunk of a long prompt each)
        clock.now += LIMIT_S - 1
        engine.steps_at = clock.now
        assert await host.check()
    assert engine.probes == engine.kills == 0
    second = await in_engine(stub, engine, "r2")
    clock.now += LIMIT_S - 1
    call.cancel()  # a request that ends: progress too
    await until(lambda: "r1" in engine.cancelled, "the first request ended")
    clock.now += 2
    assert await host.check() and engine.kills == 0
    second.cancel()


async def test_a_limit_of_0_never_kills(hung):
    engine = HungEngine()
    stub, host, clock = await hung(engine)
    host.watch = StallWatch(0, clock=clock)
    call = await in_engine(stub, engine)
    clock.now += 100 * DEFAULT_STALL_TIMEOUT_S
    assert await host.check() and engine.probes == engine.kills == 0
    call.cancel()


async def test_the_spec_sets_the_limit_and_unset_is_the_default(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(host_module, "resolve_model", lambda ref: ref)

    async def start(spec, path):
        return ScriptedEngine(["x"])
    monkeypatch.setattr(host_module, "start_engine", start)
    for spec, limit in ((common_pb2.ModelSpec(name="m", model="s"), DEFAULT_STALL_TIMEOUT_S),
                        (common_pb2.ModelSpec(name="m", model="s", stall_timeout_s=0), 0.0),
                        (common_pb2.ModelSpec(name="m", model="s", stall_timeout_s=12.5), 12.5)):
        host = ModelHost()
        host.begin_load(spec)
        await host.wait_ready()
        assert host.watch.limit_s == limit
        await host.shutdown()


async def test_a_request_whose_reader_lags_is_no_stall_of_the_engine():
    """The engine answered; the request's reader stops reading (a client that paused, a full gRPC
    flow window): the engine owes nothing, however long that lasts, and is not killed."""
    engine = HungEngine()
    engine.script = ["a", "b", "c"]
    engine.first_hold.set()
    worker = await serve_worker(engine)
    try:
        host, clock = worker.servicer.host, Clock()
        host.watch = StallWatch(LIMIT_S, clock=clock)
        request = chat("hi", model="m")
        events = worker.servicer._stream(engine, Prompt(token_ids=[1], engine_input=None),
                                         sampling_from_request(request), request, "r1", parse_tools=False)
        assert (await anext(events)).delta.text == "a"  # and nobody reads the rest
        clock.now += 10 * LIMIT_S
        assert await host.check() and engine.probes == engine.kills == 0
        await events.aclose()
    finally:
        await worker.server.stop(0)


async def test_an_engine_that_hangs_while_it_renders_a_prompt_is_killed_too(hung):
    """llama.cpp renders and tokenizes on its server: a request can wait for a hung engine before
    it generates anything, and counts as waiting for it."""
    engine = HungEngine()
    engine.render_hangs = True
    stub, host, clock = await hung(engine)
    call = asyncio.ensure_future(collect(stub, chat("hi", model="m")))
    await until(lambda: engine.renders, "the request reached the engine's render")
    clock.now += LIMIT_S + 1
    assert not await host.check() and engine.kills == 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call, 5)
    assert reason(info.value) == (grpc.StatusCode.UNAVAILABLE, "ENGINE_DIED")


@pytest.mark.parametrize("kind", ["speech", "transcription"])
async def test_a_speech_engine_that_hangs_fails_the_replica_too(hung, kind):
    """A voice or an ear runs in a thread of the worker: nothing to kill, but a sentence or segment
    that never comes fails the replica's health, as a hung text engine's step does."""
    engine = AudioDouble()
    engine.permits = threading.Semaphore(0)  # its next unit of work never starts
    stub, host, clock = await hung(engine)
    call = (stub.Synthesize(pb.SynthesizeRequest(request_id="r1", model="m", input="A. B."))
            if kind == "speech" else stub.Transcribe(pb.TranscribeRequest(request_id="r1", model="m", audio=b"x")))
    try:
        await until(lambda: engine.stats().running_requests == 1, "the request reached the engine")
        clock.now += LIMIT_S - 1
        assert await host.check()  # quiet, but not for the limit yet
        clock.now += 2
        assert not await host.check()
        assert host.phase == pb.LOAD_PHASE_FAILED and "engine hung" in host.history.events[-1].message
    finally:
        call.cancel()
        engine.permits.release(10)  # its thread ends
