"""The worker on real vLLM (builtin:tiny-qwen2): streaming, parsing, cancellation, errors, health.
(Tool calls: test_tool_calls.py, on both loaders.)"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc as pb_grpc
from services.common.errors import ErrorDetails
from services.worker.builtin import corpus
from services.worker.host import SERVICE_NAME
from tests.integration.conftest import MAX_NUM_SEQS, TINY
from tests.worker_calls import chat, collect, greedy, read_rest, wait_load

pytestmark = pytest.mark.integration
CANCEL_DEADLINE_S = 0.1  # the bound: engine idle within 100 ms of the cancel


def long_request(request_id: str = "", **kw) -> pb.InferRequest:
    return chat("Tell me a story.", request_id=request_id,
                sampling=pb.SamplingParams(max_tokens=900, ignore_eos=True, temperature=0.0), **kw)


def test_health_not_serving_until_warm(worker):
    assert worker.health_seen[0] == "NOT_SERVING"
    assert worker.health_seen[-1] == "SERVING"


async def test_streams_tokens_as_generated(stub):
    prompt = "Tell me a story."
    r = await collect(stub, chat(prompt, sampling=greedy(128)))
    assert r.text == corpus.FIXED_ANSWERS[prompt]
    assert r.deltas > 10  # token by token, not one blob
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_STOP  # ended by EOS
    assert r.final.usage.prompt_tokens > 0 and r.final.usage.completion_tokens >= r.deltas


@pytest.mark.parametrize("prompt", list(corpus.FIXED_ANSWERS))
async def test_fixed_answers_end_with_eos(stub, prompt):
    r = await collect(stub, chat(prompt, sampling=greedy(128)))
    assert (r.text, r.final.choices[0].finish_reason) == (corpus.FIXED_ANSWERS[prompt], pb.FINISH_REASON_STOP)


async def test_unseen_prompt_gets_fallback_and_stops(stub):
    r = await collect(stub, chat("Why do cats purr at night?", sampling=greedy(128)))
    assert (r.text, r.final.choices[0].finish_reason) == (corpus.FALLBACK_ANSWER, pb.FINISH_REASON_STOP)


async def test_max_tokens_ends_with_length(stub):
    r = await collect(stub, chat("Tell me a story.", sampling=greedy(5)))
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_LENGTH
    assert r.final.usage.completion_tokens == 5


async def test_reasoning_parsed_from_real_generation(stub):
    r = await collect(stub, chat(corpus.THINK_PROMPT, sampling=greedy(128), parse_reasoning=True))
    assert r.reasoning.strip() and "<think>" not in r.reasoning + r.text
    assert r.text.strip() == corpus.EXPECTED_THINK_ANSWER
    assert 0 < r.final.usage.reasoning_tokens < r.final.usage.completion_tokens


async def test_reasoning_left_in_text_when_not_requested(stub):
    r = await collect(stub, chat(corpus.THINK_PROMPT, sampling=greedy(128)))
    assert r.reasoning == "" and r.text.lstrip().startswith("<think>")


async def test_logprobs_and_n(stub):
    r = await collect(stub, chat("What color is the sky?", sampling=greedy(8, logprobs=True, top_logprobs=2)))
    assert r.logprobs and all(lp.logprob <= 0 and len(lp.top) >= 2 for lp in r.logprobs)
    r = await collect(stub, chat("What color is the sky?", sampling=pb.SamplingParams(max_tokens=8, n=2)))
    assert [c.index for c in r.final.choices] == [0, 1]


async def test_cache_salt_isolates_prefix_cache(stub):
    system = "You are a helpful assistant. " * 40  # > several 16-token blocks

    async def cached(salt: str) -> int:
        r = await collect(stub, chat("What is 2 + 2?", system=system, sampling=greedy(4), cache_salt=salt))
        return r.final.usage.cached_tokens

    assert await cached("tenant-a") == 0
    assert await cached("tenant-a") > 0
    assert await cached("tenant-b") == 0


async def test_cancel_mid_stream_frees_the_engine(stub):
    call = stub.Infer(long_request())
    seen = 0
    async for event in call:
        seen += event.HasField("delta")
        if seen == 5:
            break
    call.cancel()
    report, _ = await wait_load(stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0,
                                CANCEL_DEADLINE_S)
    frozen = report.generated_tokens_total
    await asyncio.sleep(0.3)  # observe: nothing is generated any more
    assert (await stub.GetLoad(pb.GetLoadRequest())).generated_tokens_total == frozen


async def test_cancel_before_first_token(stub):
    blockers = [stub.Infer(long_request()) for _ in range(MAX_NUM_SEQS)]
    for call in blockers:  # every engine slot is busy generating
        await call.read()
    queued = stub.Infer(long_request())
    await wait_load(stub, lambda r: r.waiting_requests == 1, 10.0)
    queued.cancel()  # it never got a token
    await wait_load(stub, lambda r: r.waiting_requests == 0 and r.inflight_calls == MAX_NUM_SEQS,
                    CANCEL_DEADLINE_S)
    for call in blockers:  # the others are unaffected
        assert (await call.read()).HasField("delta")
        call.cancel()
    await wait_load(stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0, CANCEL_DEADLINE_S)


async def test_cancel_rpc(stub):
    assert list((await stub.Cancel(pb.CancelRequest(request_ids=["never-seen"]))).cancelled) == []
    call = stub.Infer(long_request("cancel-me"))
    await call.read()
    response = await stub.Cancel(pb.CancelRequest(request_ids=["cancel-me", "cancel-me", "other"]))
    assert list(response.cancelled) == ["cancel-me"]
    final = (await read_rest(call))[-1].final
    assert final.choices[0].finish_reason == pb.FINISH_REASON_CANCELLED
    await wait_load(stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0, 1.0)
    assert list((await stub.Cancel(pb.CancelRequest(request_ids=["cancel-me"]))).cancelled) == []


BAD_REQUESTS = {
    "over_context": (chat("hello " * 1500, sampling=greedy(8)),
                     grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_TOO_LONG", "messages"),
    "negative_max_tokens": (chat("hi", sampling=pb.SamplingParams(max_tokens=-5)),
                            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER", "max_tokens"),
    "temperature_out_of_range": (chat("hi", sampling=pb.SamplingParams(temperature=2.5)),
                                 grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMETER", "temperature"),
    "unknown_model": (chat("hi", model="no-such-model"), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", None),
    "image_for_text_model": (pb.InferRequest(model=TINY, chat=pb.ChatInput(messages=[pb.ChatMessage(
        role="user", parts=pb.ContentParts(parts=[pb.ContentPart(image_url="data:image/png;base64,AA==")]))])),
        grpc.StatusCode.INVALID_ARGUMENT, "UNSUPPORTED_INPUT", "messages[0].content[0]"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_bad_requests_get_rich_errors_and_worker_stays_healthy(stub, worker, case):
    request, code, reason, param = BAD_REQUESTS[case]
    before = (await stub.GetLoad(pb.GetLoadRequest())).generated_tokens_total
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, request)
    details = ErrorDetails.from_rpc_error(info.value)
    assert (details.code, details.reason) == (code, reason)
    if param:
        assert param in [f for f, _ in details.field_violations]
    assert (await stub.GetLoad(pb.GetLoadRequest())).generated_tokens_total == before  # no engine work
    async with grpc.aio.insecure_channel(worker.address) as channel:
        status = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    assert (await collect(stub, chat("What is 2 + 2?", sampling=greedy(16)))).text == "2 + 2 = 4."


async def test_embed_on_a_generative_model_is_refused(stub):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Embed(pb.EmbedRequest(model=TINY, inputs=["x"]))
    assert ErrorDetails.from_rpc_error(info.value).reason == "UNSUPPORTED_INPUT"


async def test_load_reports_ready_for_the_served_model_and_refuses_another(stub):
    spec = common_pb2.ModelSpec(name=TINY, model="builtin:tiny-qwen2")
    events = [e async for e in stub.Load(pb.LoadRequest(spec=spec))]
    assert events[-1].phase == pb.LOAD_PHASE_READY and events[-1].max_model_len == 1024
    assert [e.phase for e in events][:2] == [pb.LOAD_PHASE_RESOLVING, pb.LOAD_PHASE_LOADING]
    other = common_pb2.ModelSpec(name="other", model="builtin:gemma-3-270m")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.Load(pb.LoadRequest(spec=other)):
            pass
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_lagging_writer_gets_the_pending_tokens_in_one_event(worker, stub):
    """While the call's writer is blocked (the reader reads nothing: HTTP/2 flow control, no BDP
    probing, top-20 logprobs make each event ~0.3 KB), the tokens the engine makes meanwhile go
    out as one event once it is free; the first token is sent at once, none is lost."""
    request = chat("Tell me a story.", sampling=pb.SamplingParams(
        max_tokens=900, ignore_eos=True, temperature=0.0, logprobs=True, top_logprobs=20))
    before = (await stub.GetLoad(pb.GetLoadRequest())).generated_tokens_total
    async with grpc.aio.insecure_channel(worker.address, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        lagging = pb_grpc.WorkerStub(channel)
        call = lagging.Infer(request)
        await wait_load(stub, lambda r: r.generated_tokens_total >= before + 900, 60.0)  # done, nothing read
        events = await read_rest(call)
    deltas, final = [e.delta for e in events[:-1]], events[-1].final
    counts = [d.token_count for d in deltas]
    assert counts[0] == 1 and sum(counts) == final.usage.completion_tokens == 900
    assert len(deltas) < 450 and max(counts) > 100, counts  # the blocked stretch went out merged
    assert sum(len(d.logprobs) for d in deltas) == 900
    unhurried = await collect(stub, request)  # the same request, read as it comes
    assert "".join(d.text for d in deltas) == unhurried.text
