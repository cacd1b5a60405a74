"""`/v1/chat/completions` results: the `chat.completion` object and its chunk stream built from scripted
worker events, checked against the `openai` package's types and its own stream helper, and the SDK
end to end against a stand-in edge."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import openai.types
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.chat.protocol import parse_chat_request
from services.gateway.chat.protocol import to_infer_request as chat_to_infer
from services.gateway.chat.protocol_output import ChatCompletionAssembler, ChatStreamEncoder
from services.gateway.edge.answer import answer
from services.gateway.edge.sse import SSE_DONE, sse_event, sse_response_event
from services.gateway.protocol_common.openai_error import OpenAIError
from tests.unit.chat_requests import USER, WEATHER, chat_body
from tests.unit.worker_events import LENGTH, STOP, TEXT, THINKING, TOOL_CALL, delta, final, lp

# ---- scripted worker events ----------------------------------------------------------------------------



def assemble(events: list[pb.InferEvent], **kw: Any) -> dict[str, Any]:
    asm = ChatCompletionAssembler("tiny", completion_id="chatcmpl-1", created=123, **kw)
    for event in events:
        asm.add(event)
    return asm.result()


def test_chat_completion_text():
    out = assemble(TEXT)
    parsed = ChatCompletion.model_validate(out)
    assert (parsed.id, parsed.object, parsed.created, parsed.model) == ("chatcmpl-1", "chat.completion", 123, "tiny")
    choice = parsed.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", "Hello, world", "stop")
    assert choice.message.tool_calls is None and choice.logprobs is None
    assert "reasoning_content" not in out["choices"][0]["message"]
    assert parsed.usage.model_dump(exclude_none=True) == {
        "prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens_details": {"reasoning_tokens": 0}}
    assert out["system_fingerprint"] is None and out["service_tier"] is None


def test_chat_completion_reasoning():
    out = assemble(THINKING)
    message = out["choices"][0]["message"]
    assert message["content"] == "42"
    assert message["reasoning_content"] == message["reasoning"] == "Let me think."
    parsed = ChatCompletion.model_validate(out)
    assert parsed.usage.completion_tokens_details.reasoning_tokens == 3


def test_chat_completion_tool_calls():
    parsed = ChatCompletion.model_validate(assemble(TOOL_CALL))
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.id, c.type, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "function", "get_weather", '{"city": "Paris"}'), ("call_b", "function", "get_time", "{}")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}


def test_chat_completion_n2_and_length():
    events = [delta("a", index=0), delta("b", index=1), delta("c", index=0), final(STOP, LENGTH)]
    parsed = ChatCompletion.model_validate(assemble(events, n=2))
    assert [(c.index, c.message.content, c.finish_reason) for c in parsed.choices] == [
        (0, "ac", "stop"), (1, "b", "length")]


def test_chat_completion_logprobs():
    events = [delta("Hi", logprobs=[lp("Hi", -0.1, ("Hi", -0.1), ("Hey", -2.5))]),
              delta("!", logprobs=[lp("!", float("-inf"))]), final(STOP)]
    parsed = ChatCompletion.model_validate(assemble(events, logprobs=True))
    content = parsed.choices[0].logprobs.content
    assert [(t.token, t.logprob, t.bytes) for t in content] == [("Hi", pytest.approx(-0.1), [72, 105]),
                                                                ("!", -9999.0, [33])]
    assert [(t.token, t.logprob) for t in content[0].top_logprobs] == [("Hi", pytest.approx(-0.1)),
                                                                      ("Hey", pytest.approx(-2.5))]
    assert content[1].top_logprobs == []
    json.dumps(assemble(events, logprobs=True), allow_nan=False)  # no -inf in the JSON


def test_chat_completion_errors():
    with pytest.raises(OpenAIError) as e:
        assemble([delta("x"), final(pb.FINISH_REASON_ERROR)])
    assert e.value.status == 500 and e.value.type == "server_error"
    with pytest.raises(OpenAIError) as e:
        assemble([delta("x")])  # the stream ended without its final event
    assert e.value.status == 500


def test_cancelled_choices_end_as_stop():
    asm = ChatCompletionAssembler("tiny")
    for event in [delta("partial"), final(pb.FINISH_REASON_CANCELLED)]:
        asm.add(event)
    assert asm.cancelled
    assert ChatCompletion.model_validate(asm.result()).choices[0].finish_reason == "stop"


def test_assembler_for_request():
    req = parse_chat_request(chat_body(n=2, logprobs=True))
    asm = ChatCompletionAssembler.for_request(req)
    asm.add(final(STOP, STOP))
    out = asm.result()
    assert out["id"].startswith("chatcmpl-") and len(out["choices"]) == 2
    assert out["choices"][1]["message"]["content"] == "" and out["choices"][1]["logprobs"] == {
        "content": [], "refusal": None}


# ---- chat streaming ----------------------------------------------------------------------------------

def stream(events: list[pb.InferEvent], **kw: Any) -> list[dict[str, Any]]:
    enc = ChatStreamEncoder("tiny", completion_id="chatcmpl-s", created=99, **kw)
    chunks = [c for event in events for c in enc.encode(event)]
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
        assert (c["id"], c["created"], c["model"], c["object"]) == ("chatcmpl-s", 99, "tiny", "chat.completion.chunk")
    return chunks


def accumulate(chunks: list[dict[str, Any]], **kw: Any):
    """What the openai SDK's own stream helper makes of the chunks (its snapshot: the final
    completion refuses to parse a "length" finish)."""
    state = ChatCompletionStreamState(**kw)
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    return state.current_completion_snapshot


def test_stream_text():
    chunks = stream(TEXT)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}, {"content": "Hello"}, {"content": ", world"}, {}]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]
    assert all("usage" not in c for c in chunks)
    done = accumulate(chunks)
    assert done.choices[0].message.content == "Hello, world" and done.choices[0].finish_reason == "stop"


def test_stream_include_usage():
    chunks = stream(TEXT, include_usage=True)
    assert all(c["usage"] is None for c in chunks[:-1])
    last = ChatCompletionChunk.model_validate(chunks[-1])
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        5, 7, 12)
    assert last.usage.prompt_tokens_details.cached_tokens == 2


def test_stream_reasoning():
    chunks = stream(THINKING)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[1] == {"reasoning_content": "Let me ", "reasoning": "Let me "}
    assert deltas[3] == {"content": "42"}
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me think."


def test_stream_tool_calls():
    chunks = stream(TOOL_CALL)
    calls = [c["choices"][0]["delta"].get("tool_calls") for c in chunks]
    assert calls[1] == [{"index": 0, "id": "call_a", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": '}}]
    assert calls[2] == [{"index": 0, "function": {"arguments": '"Paris"}'}}]
    assert calls[3][0]["id"] == "call_b"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    done = accumulate(chunks, input_tools=[WEATHER, {"type": "function", "function": {"name": "get_time"}}])
    message = done.choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_a", "get_weather", '{"city": "Paris"}'), ("call_b", "get_time", "{}")]
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_stream_n2_interleaved():
    events = [delta("a", index=1), delta("b", index=0), delta("c", index=1), final(STOP, LENGTH)]
    chunks = stream(events, include_usage=True)
    opened = [c["choices"][0]["index"] for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert opened == [0, 1]  # in index order, even when choice 1 speaks first (the SDK's helper relies on it)
    done = accumulate(chunks[:-1])
    assert [(c.index, c.message.content, c.finish_reason) for c in done.choices] == [
        (0, "b", "stop"), (1, "ac", "length")]


def test_stream_choice_without_deltas_still_opens():
    chunks = stream([final(STOP)])
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {}]


def test_stream_logprobs():
    chunks = stream([delta("Hi", logprobs=[lp("Hi", -0.5, ("Yo", -1.0))]), final(STOP)], logprobs=True)
    content = ChatCompletionChunk.model_validate(chunks[1]).choices[0].logprobs.content
    assert [(t.token, t.logprob, [x.token for x in t.top_logprobs]) for t in content] == [("Hi", -0.5, ["Yo"])]
    assert chunks[0]["choices"][0]["logprobs"] is None


def test_stream_error_raises():
    enc = ChatStreamEncoder("tiny")
    enc.encode(delta("x"))
    with pytest.raises(OpenAIError) as e:
        enc.encode(final(pb.FINISH_REASON_ERROR))
    assert e.value.status == 500 and sse_event(e.value.body()).startswith(b'data: {"error":')


def test_stream_encoder_for_request():
    req = parse_chat_request(chat_body(stream=True, stream_options={"include_usage": True}, logprobs=True))
    enc = ChatStreamEncoder.for_request(req)
    assert enc.include_usage and enc.logprobs and enc.id.startswith("chatcmpl-")
    assert not ChatStreamEncoder.for_request(parse_chat_request(chat_body(stream=True))).include_usage


def test_parallel_tool_calls_false_answers_at_most_one_call():
    """`parallel_tool_calls: false` promises at most one call: a second one the model makes anyway is
    dropped, whole and streamed (vLLM's `maybe_filter_parallel_tool_calls` does the same)."""
    tools = [WEATHER, {"type": "function", "function": {"name": "get_time"}}]
    req = parse_chat_request(chat_body(tools=tools, parallel_tool_calls=False))
    asm = ChatCompletionAssembler.for_request(req)
    for event in TOOL_CALL:
        asm.add(event)
    message = ChatCompletion.model_validate(asm.result()).choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_a", "get_weather", '{"city": "Paris"}')]
    enc = ChatStreamEncoder.for_request(parse_chat_request(chat_body(tools=tools, parallel_tool_calls=False,
                                                                     stream=True)))
    chunks = [c for event in TOOL_CALL for c in enc.encode(event)]
    done = accumulate(chunks, input_tools=tools)
    assert [c.function.name for c in done.choices[0].message.tool_calls] == ["get_weather"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # left unset (OpenAI's default: true), every call stays
    asm = ChatCompletionAssembler.for_request(parse_chat_request(chat_body(tools=tools)))
    for event in TOOL_CALL:
        asm.add(event)
    assert len(asm.result()["choices"][0]["message"]["tool_calls"]) == 2


def test_top_logprobs_has_at_most_the_alternatives_asked_for():
    """vLLM's logprobs hold the top k plus the sampled token when it ranks below them (the worker's
    `_logprobs` passes all on); OpenAI's `top_logprobs` never holds more than asked, and none for 0."""
    from types import SimpleNamespace

    from services.worker.vllm_engine import _logprobs

    def entry(token: str, logprob: float, rank: int) -> SimpleNamespace:
        return SimpleNamespace(decoded_token=token, logprob=logprob, rank=rank)

    engine = _logprobs([9, 8], [{9: entry("z", -5.0, 7), 1: entry("a", -0.1, 1), 2: entry("b", -0.9, 2)},
                                {8: entry("y", -0.2, 1)}])
    assert [len(lp.top) for lp in engine] == [3, 1]  # k=2 (+ the sampled token), k=0 (+ the sampled token)
    events = [delta("zy", logprobs=[lp(x.token, x.logprob, *((t.token, t.logprob) for t in x.top))
                                    for x in engine]), final(STOP)]
    for k, want in ((2, [["a", "b"], ["y"]]), (0, [[], []])):
        req = parse_chat_request(chat_body(logprobs=True, **({"top_logprobs": k} if k else {})))
        asm = ChatCompletionAssembler.for_request(req)
        for event in events:
            asm.add(event)
        content = ChatCompletion.model_validate(asm.result()).choices[0].logprobs.content
        assert [[t.token for t in c.top_logprobs] for c in content] == want
        enc = ChatStreamEncoder.for_request(parse_chat_request(chat_body(logprobs=True, stream=True,
                                                                         **({"top_logprobs": k} if k else {}))))
        chunks = [c for event in events for c in enc.encode(event)]
        streamed = ChatCompletionChunk.model_validate(chunks[1]).choices[0].logprobs.content
        assert [[t.token for t in c.top_logprobs] for c in streamed] == want


def test_sse_framing():
    frame = sse_event({"a": "é 🙂", "b": [1, None], 2: 0.5})
    assert frame == 'data: {"a":"é 🙂","b":[1,null],"2":0.5}\n\n'.encode()  # compact, UTF-8 unescaped
    assert SSE_DONE == b"data: [DONE]\n\n"
    assert sse_response_event({"type": "response.created", "x": 1}) == (
        b'event: response.created\ndata: {"type":"response.created","x":1}\n\n')


def test_a_whole_answer_is_the_same_compact_utf8_json():
    r = answer({"a": "é 🙂", "b": [1, None], 2: 0.5})
    assert r.body == '{"a":"é 🙂","b":[1,null],"2":0.5}'.encode()
    assert r.headers["content-type"] == "application/json" and r.status_code == 200


# ---- the official SDK end to end (no network: httpx.MockTransport) ---------------------------------------

def sdk_client(respond) -> openai.OpenAI:
    """An openai client whose HTTP calls go to `respond(body) -> httpx.Response`."""
    def handler(request: httpx.Request) -> httpx.Response:
        return respond(json.loads(request.content))
    return openai.OpenAI(base_url="http://edge.test/v1", api_key="k", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def serve_chat(events: list[pb.InferEvent]):
    """A stand-in edge: parse as the gateway will, convert, then answer from scripted worker events."""
    seen: list[pb.InferRequest] = []

    def respond(body: dict[str, Any]) -> httpx.Response:
        try:
            req = parse_chat_request(body)
            seen.append(chat_to_infer(req, request_id="r", cache_salt="s"))
        except OpenAIError as e:
            return httpx.Response(e.status, json=e.body(), headers=e.headers)
        if not req.stream:
            asm = ChatCompletionAssembler.for_request(req)
            for event in events:
                asm.add(event)
            return httpx.Response(200, json=asm.result())
        enc = ChatStreamEncoder.for_request(req)
        frames = b"".join(sse_event(c) for event in events for c in enc.encode(event)) + SSE_DONE
        return httpx.Response(200, content=frames, headers={"content-type": "text/event-stream"})
    return respond, seen


def test_sdk_request_with_every_field_is_accepted():
    respond, seen = serve_chat(TEXT)
    client = sdk_client(respond)
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "developer", "content": "be brief"}, USER], max_completion_tokens=16,
        temperature=0.2, top_p=0.9, n=1, stop=["\n"], seed=1, presence_penalty=0.1, frequency_penalty=0.1,
        logprobs=True, top_logprobs=2, response_format={"type": "json_object"}, tools=[WEATHER], tool_choice="auto",
        parallel_tool_calls=False, user="u", metadata={"a": "b"}, store=False, service_tier="auto",
        reasoning_effort="low", modalities=["text"], prediction={"type": "content", "content": "x"},
        verbosity="medium", prompt_cache_key="pk", safety_identifier="si",
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.05, "ignore_eos": False, "min_tokens": 1,
                    "skip_special_tokens": True, "include_stop_str_in_output": False,
                    "chat_template_kwargs": {"enable_thinking": True}})
    assert out.choices[0].message.content == "Hello, world" and out.usage.total_tokens == 12
    req = seen[0]
    assert (req.sampling.max_tokens, req.sampling.top_k) == (16, 5)
    assert req.tool_choice.mode == pb.TOOL_CHOICE_MODE_AUTO and not req.parallel_tool_calls
    assert json.loads(req.chat.chat_template_kwargs_json)["enable_thinking"] is True


def test_sdk_sees_our_400s_as_bad_request():
    respond, _ = serve_chat(TEXT)
    client = sdk_client(respond)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[USER], temperature=5)
    assert e.value.param == "temperature" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[USER], extra_body={"cache_salt": "x"})
    assert e.value.param == "cache_salt"


def test_sdk_streams_tool_calls_with_its_helper():
    respond, _ = serve_chat(TOOL_CALL)
    client = sdk_client(respond)
    tools = [WEATHER, {"type": "function", "function": {"name": "get_time"}}]
    with client.chat.completions.stream(model="tiny", messages=[USER], tools=tools,
                                        stream_options={"include_usage": True}) as s:
        kinds = [event.type for event in s]
        done = s.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    calls = done.choices[0].message.tool_calls
    assert [(c.id, c.function.name) for c in calls] == [("call_a", "get_weather"), ("call_b", "get_time")]
    assert done.choices[0].finish_reason == "tool_calls" and done.usage.total_tokens == 12


def test_sdk_streams_text():
    respond, _ = serve_chat(THINKING)
    client = sdk_client(respond)
    chunks = list(client.chat.completions.create(model="tiny", messages=[USER], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "42"
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == "Let me think."
