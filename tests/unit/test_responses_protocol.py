"""The `/v1/responses` protocol layer: request validation (400s naming the field), input items to
chat messages, `pb.InferRequest`, and the response object and event stream built from scripted
worker events. Every object and event is checked against the saved Open Responses schema
(tests/data/openresponses) and parsed with the official `openai` package's types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response
from pydantic import ValidationError

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.errors import OpenAIError
from services.gateway.protocol import (
    ResponseAssembler,
    ResponseStreamEncoder,
    echo_fields,
    error_event,
    parse_compact_request,
    parse_response_request,
    responses_infer_request,
    sse_response_event,
    to_messages,
)
from tests.openresponses import (
    CREATE_SCHEMA,
    EVENT_SCHEMA,
    RESPONSE_SCHEMA,
    SDK_EVENT,
    SPEC,
    check_events,
    check_response,
    spec_errors,
)

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": "hi", **kw}


def refused(parse, data: Any) -> OpenAIError:
    with pytest.raises(OpenAIError) as e:
        parse(data)
    assert e.value.status == 400, e.value
    assert e.value.body()["error"]["type"] == "invalid_request_error"
    return e.value


def delta(text: str = "", *, reasoning: str = "", calls: list[pb.ToolCallDelta] | None = None,
          logprobs: list[pb.TokenLogprob] | None = None) -> pb.InferEvent:
    return pb.InferEvent(delta=pb.Delta(text=text, reasoning=reasoning, tool_calls=calls or [],
                                        logprobs=logprobs or []))


def final(reason: int = pb.FINISH_REASON_STOP, *, prompt: int = 5, completion: int = 7, cached: int = 2,
          reasoning: int = 0) -> pb.InferEvent:
    return pb.InferEvent(final=pb.Final(
        choices=[pb.ChoiceFinish(index=0, finish_reason=reason)],
        usage=common_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                               reasoning_tokens=reasoning)))


def call(index: int, arguments: str, *, id: str = "", name: str = "") -> pb.ToolCallDelta:
    return pb.ToolCallDelta(index=index, id=id, name=name, arguments=arguments)


STOP, LENGTH, TOOLS = pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_TOOL_CALLS
TEXT = [delta("Hello"), delta(", world"), final()]
THINKING = [delta(reasoning="Let me "), delta(reasoning="think."), delta("4"), delta("2"), final(reasoning=3)]
TOOL_CALLS = [delta(calls=[call(0, '{"city": ', id="call_a", name="get_weather")]),
              delta(calls=[call(0, '"Paris"}')]),
              delta(calls=[call(1, "{}", id="call_b", name="get_time")]), final(TOOLS)]
TRUNCATED = [delta("Once upon"), delta(" a time"), final(LENGTH)]
BROKEN = [delta("Half an ans"), final(pb.FINISH_REASON_ERROR)]


def request(**kw: Any):
    return parse_response_request(body(**kw))


def stream(events: list[pb.InferEvent], *, start: int = 0, **kw: Any) -> tuple[ResponseStreamEncoder, list]:
    enc = ResponseStreamEncoder.for_request(request(**kw), sequence_number=start)
    out = enc.start()
    for event in events:
        out += enc.encode(event)
    return enc, out


def assemble(events: list[pb.InferEvent], **kw: Any) -> dict[str, Any]:
    asm = ResponseAssembler.for_request(request(**kw), response_id="resp_1", created_at=123)
    for event in events:
        asm.add(event)
    return asm.result()


def test_the_schema_checks_bite():
    """The saved schema really constrains: a missing required field or a wrong event shape fails."""
    out = assemble(TEXT)
    assert spec_errors(RESPONSE_SCHEMA, {k: v for k, v in out.items() if k != "service_tier"})
    assert spec_errors(RESPONSE_SCHEMA, {**out, "output": [{**out["output"][0], "status": "done"}]})
    event = {"type": "response.output_text.delta", "sequence_number": 0, "item_id": "m", "output_index": 0,
             "content_index": 0, "delta": "x"}
    assert spec_errors(EVENT_SCHEMA, event) == []
    assert spec_errors(EVENT_SCHEMA, {**event, "type": "response.reasoning_text.delta"})  # OpenAI's name only
    assert spec_errors(EVENT_SCHEMA, {k: v for k, v in event.items() if k != "item_id"})
    assert SPEC["info"]["version"] == "2026-04-24"


# ---- request validation ------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "param"), [
    ({"foo": 1}, "foo"),
    ({"max_tokens": 5}, "max_tokens"),  # chat's name
    ({"messages": []}, "messages"),
    ({"cache_salt": "mine"}, "cache_salt"),
    ({"input": [{"role": "user", "content": "x", "foo": 1}]}, "input[0].foo"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "foo": 1}]}]},
     "input[0].content[0].foo"),
    ({"input": [{"role": "user", "content": "x", "phase": "commentary"}]}, "input[0].phase"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),  # chat's shape: no name
    ({"tools": [{**WEATHER, "extra": True}]}, "tools[0].extra"),
    ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options.include_usage"),
    ({"reasoning": {"effort": "low", "generate_summary": "auto"}}, "reasoning.generate_summary"),
    ({"text": {"format": {"type": "json_schema", "schema": {}, "json_schema": {}}}}, "text.format.json_schema"),
])
def test_unknown_fields_are_400_naming_them(extra, param):
    err = refused(parse_response_request, {**body(), **extra})
    assert err.param == param, err.message


def test_unknown_field_message_reads_like_openai():
    err = refused(parse_response_request, {**body(), "foo": 1})
    assert err.message == "Unrecognized request argument supplied: foo"


@pytest.mark.parametrize(("extra", "param"), [
    ({"model": 3}, "model"),
    ({"input": 5}, "input"),
    ({"input": [5]}, "input[0]"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input[0].content[0].text"),
    ({"input": [{"role": "user", "content": [{"text": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "message", "content": "x"}]}, "input[0].role"),
    ({"input": [{"content": "x"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "bad name", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": [{"type": "function_call_output", "call_id": "", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "reasoning", "summary": "x"}]}, "input[0].summary"),
    ({"input": [{"type": "bogus"}]}, "input[0].type"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"max_output_tokens": 20.5}, "max_output_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"store": "no"}, "store"),
    ({"tools": "x"}, "tools"),
    ({"tool_choice": 3}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function"}, "tools": [WEATHER]}, "tool_choice.name"),
    ({"text": {"format": "json"}}, "text.format"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": []}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"include": ["bogus"]}, "include[0]"),
    ({"truncation": "sometimes"}, "truncation"),
])
def test_wrong_types_and_shapes_name_the_field_path(extra, param):
    err = refused(parse_response_request, {**body(), **extra})
    assert err.param == param, err.message


@pytest.mark.parametrize(("extra", "param"), [
    ({"max_output_tokens": 15}, "max_output_tokens"),  # the spec's (and OpenAI's) minimum is 16
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"max_tool_calls": 0}, "max_tool_calls"),
    ({"safety_identifier": "x" * 65}, "safety_identifier"),
])
def test_range_checks(extra, param):
    assert refused(parse_response_request, {**body(), **extra}).param == param


def test_metadata_limits():
    assert request(metadata={f"k{i}": "v" for i in range(16)}).metadata
    assert request(metadata={"k" * 64: "v" * 512}).metadata
    err = refused(parse_response_request, {**body(), "metadata": {f"k{i}": "v" for i in range(17)}})
    assert err.param == "metadata" and "at most 16 properties" in err.message
    err = refused(parse_response_request, {**body(), "metadata": {"k" * 65: "v"}})
    assert err.param == "metadata" and "at most 64 characters" in err.message
    err = refused(parse_response_request, {**body(), "metadata": {"k": "v" * 513}})
    assert err.param == "metadata.k" and "maximum length 512" in err.message


def test_missing_model_and_input():
    err = refused(parse_response_request, {"input": "hi"})
    assert (err.param, err.message) == ("model", "Missing required parameter: 'model'.")
    assert refused(parse_response_request, {"model": "m"}).param == "input"
    assert parse_response_request({"model": "m", "previous_response_id": "resp_1"}).input_items == []


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "u"}]}]},
     "input[0].content[0].type", "File input"),
    ({"input": [{"role": "user", "content": [{"type": "input_video", "video_url": "u"}]}]},
     "input[0].content[0].type", "Video input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].file_id", "file ids"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}]},
     "input[0].content[0].image_url", "needs an 'image_url'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "previous_response_id"),
    ({"input": [{"id": "msg_1"}]}, "input[0].type", "Item references"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only 'function' tools"),
    ({"tool_choice": {"type": "file_search"}, "tools": [WEATHER]}, "tool_choice.type", "not supported"),
    ({"conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "Prompt templates"),
    ({"background": True, "store": False}, "background", "store"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options", "only allowed when 'stream'"),
    ({"tool_choice": "required"}, "tool_choice", "only allowed when 'tools'"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice", "'nope'"),
    ({"tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "nope"}]}, "tools": [WEATHER]},
     "tool_choice", "'nope'"),
])
def test_what_we_cannot_honour_is_refused_clearly(extra, param, words):
    err = refused(parse_response_request, {**body(), **extra})
    assert err.param == param and words in err.message, (err.param, err.message)


def test_bad_json_and_non_object_bodies():
    assert refused(parse_response_request, b"{nope").code == "invalid_json"
    assert refused(parse_response_request, b"[]").message == "The request body must be a JSON object."


def test_every_spec_field_is_accepted():
    full = body(
        input=[{"type": "message", "role": "developer", "content": "be brief"},
               {"type": "message", "role": "user", "content": [
                   {"type": "input_text", "text": "look"},
                   {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]},
               {"type": "message", "role": "assistant", "content": [
                   {"type": "output_text", "text": "ok", "annotations": []}], "phase": "final_answer"},
               {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}], "encrypted_content": None},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}",
                "status": "completed"},
               {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        previous_response_id="resp_0", include=["message.output_text.logprobs", "reasoning.encrypted_content"],
        tools=[WEATHER], tool_choice={"type": "allowed_tools", "tools": [{"type": "function", "name": "get_weather"}],
                                      "mode": "auto"},
        metadata={"team": "a"}, text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"},
                                                 "strict": True}, "verbosity": "low"},
        temperature=0.5, top_p=0.9, presence_penalty=0.1, frequency_penalty=0.2, parallel_tool_calls=False,
        stream=True, stream_options={"include_obfuscation": False}, background=False, max_output_tokens=64,
        max_tool_calls=3, reasoning={"effort": "high", "summary": "auto"}, safety_identifier="u1",
        prompt_cache_key="k1", truncation="auto", instructions="Be kind.", store=False, service_tier="priority",
        top_logprobs=3)
    assert spec_errors(CREATE_SCHEMA, full) == []
    req = parse_response_request(full)
    assert (req.logprobs, req.should_store, req.allowed_tools) == (True, False, {"get_weather"})
    assert len(req.input_items) == 6


def test_openai_only_fields_are_accepted():
    req = parse_response_request({**body(), "user": "u", "prompt_cache_retention": "24h", "service_tier": "flex",
                                  "input": [{"role": "user", "content": "x"}],  # no "type": OpenAI's easy message
                                  "reasoning": {"effort": "minimal"}})
    assert req.reasoning.spec_effort == "low"
    assert echo_fields(req)["reasoning"] == {"effort": "low", "summary": None}


def test_compaction_request():
    req = parse_compact_request({"model": "m", "previous_response_id": "resp_1", "instructions": "Keep goals."})
    assert (req.model, req.previous_response_id, req.input_items) == ("m", "resp_1", [])
    assert parse_compact_request({"model": "m", "input": "hello"}).input_items[0].content == "hello"
    err = refused(parse_compact_request, {"input": "hello"})
    assert (err.param, err.message) == ("model", "Missing required parameter: 'model'.")
    assert refused(parse_compact_request, {"model": "m", "input": "x", "stream": True}).param == "stream"
    assert refused(parse_compact_request, {"model": "m"}).param == "input"


# ---- conversion: input items to chat messages --------------------------------------------------

def test_string_input_and_instructions():
    req = request(instructions="Be kind.")
    msgs = to_messages(req.instructions, [], req.input)
    assert [(m.role, m.content) for m in msgs] == [("system", "Be kind."), ("user", "hi")]
    assert [(m.role, m.content) for m in to_messages(None, [], "x")] == [("user", "x")]


def test_every_message_role_and_content_part():
    req = request(input=[
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        {"type": "message", "role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                     {"type": "input_image", "image_url": "https://x/cat.png"}]},
        {"type": "message", "role": "assistant", "phase": "commentary", "status": "completed", "id": "msg_1",
         "content": [{"type": "output_text", "text": "a cat", "annotations": [], "logprobs": []},
                     {"type": "refusal", "refusal": "no more"}]}])
    msgs = to_messages(None, [], req.input)
    assert [m.role for m in msgs] == ["system", "developer", "user", "assistant"]
    assert [p.text for p in msgs[0].parts.parts] == ["sys"] and msgs[1].content == "dev"
    user = msgs[2].parts.parts
    assert (user[0].text, user[1].image_url) == ("what is this?", "https://x/cat.png")
    assert [p.text for p in msgs[3].parts.parts] == ["a cat", "no more"]


def test_function_calls_outputs_and_reasoning():
    req = request(input=[
        {"role": "user", "content": "weather and time?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Two tools."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"},
                                                                     {"type": "input_image", "image_url": "u"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "raw"}]},
        {"type": "message", "role": "assistant", "content": "Sunny at noon."}])
    msgs = to_messages(None, [], req.input)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = msgs[1]
    assert [(c.id, c.name, c.arguments) for c in calls.tool_calls] == [
        ("c1", "get_weather", '{"city":"Paris"}'), ("c2", "get_time", "{}")]
    assert (calls.reasoning, calls.WhichOneof("body")) == ("Two tools.", None)
    assert (msgs[2].tool_call_id, msgs[2].content) == ("c1", "sunny")
    assert (msgs[3].tool_call_id, msgs[3].parts.parts[0].text, msgs[3].parts.parts[1].image_url) == ("c2", "noon", "u")
    assert (msgs[4].content, msgs[4].reasoning) == ("Sunny at noon.", "raw")


def test_history_items_come_first_and_may_be_stored_dicts():
    """A previous response's input and output (as stored dicts, our own output items included)
    come before this request's input."""
    previous = assemble(THINKING, input="What is 6*7?")
    history = [{"role": "user", "content": "What is 6*7?"}, *previous["output"]]
    msgs = to_messages("Be exact.", history, "And 6*8?")
    assert [(m.role, m.content or "") for m in msgs] == [
        ("system", "Be exact."), ("user", "What is 6*7?"), ("assistant", ""), ("user", "And 6*8?")]
    assert [p.text for p in msgs[2].parts.parts] == ["42"] and msgs[2].reasoning == "Let me think."
    with pytest.raises(OpenAIError) as e:
        to_messages(None, [{"type": "bogus"}], "x")
    assert e.value.status == 400


def test_unencodable_text_is_400_not_500():
    req = parse_response_request(b'{"model": "m", "input": "\\ud800"}')
    with pytest.raises(OpenAIError) as e:
        to_messages(None, [], req.input)
    assert e.value.status == 400


# ---- conversion: the worker request --------------------------------------------------------------

def infer(**kw: Any) -> pb.InferRequest:
    req = request(**kw)
    return responses_infer_request(req, to_messages(req.instructions, [], req.input), request_id="r1",
                                   cache_salt="salt")


def test_minimal_infer_request():
    out = infer()
    assert (out.request_id, out.model, out.cache_salt, out.parse_reasoning) == ("r1", "tiny", "salt", True)
    assert [(m.role, m.content) for m in out.chat.messages] == [("user", "hi")]
    assert not out.sampling.HasField("max_tokens") and not out.sampling.HasField("temperature")
    assert (out.parallel_tool_calls, out.tool_choice.mode) == (True, pb.TOOL_CHOICE_MODE_UNSPECIFIED)
    assert not out.HasField("response_format") and out.chat.chat_template_kwargs_json == ""


def test_sampling_fields():
    out = infer(max_output_tokens=64, temperature=0.3, top_p=0.5, presence_penalty=0.5, frequency_penalty=-0.5,
                top_logprobs=4, include=["message.output_text.logprobs"])
    s = out.sampling
    assert (s.max_tokens, s.logprobs, s.top_logprobs) == (64, True, 4)
    assert s.temperature == pytest.approx(0.3) and s.top_p == pytest.approx(0.5)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, -0.5)
    assert not infer(top_logprobs=4).sampling.HasField("top_logprobs")  # logprobs are asked for with `include`


def test_text_formats():
    fmt = infer(text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"},
                                 "strict": True}}).response_format
    assert (fmt.json_schema.name, json.loads(fmt.json_schema.schema_json), fmt.json_schema.strict) == (
        "out", {"type": "object"}, True)
    assert infer(text={"format": {"type": "json_schema", "schema": {}}}).response_format.json_schema.name == "response"
    assert infer(text={"format": {"type": "json_object"}}).response_format.json_object
    assert infer(text={"format": {"type": "text"}}).response_format.text
    assert not infer(text={"verbosity": "high"}).HasField("response_format")


def test_tools_and_tool_choice():
    out = infer(tools=[WEATHER, TIME], parallel_tool_calls=False)
    assert [(t.name, t.description, json.loads(t.parameters_json)) for t in out.tools] == [
        ("get_weather", "Weather in a city", WEATHER["parameters"]), ("get_time", "", TIME["parameters"])]
    assert out.parallel_tool_calls is False
    modes = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "none": pb.TOOL_CHOICE_MODE_NONE,
             "required": pb.TOOL_CHOICE_MODE_REQUIRED}
    for choice, mode in modes.items():
        assert infer(tools=[WEATHER], tool_choice=choice).tool_choice.mode == mode
    named = infer(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}).tool_choice
    assert (named.mode, named.function_name) == (pb.TOOL_CHOICE_MODE_FUNCTION, "get_weather")
    allowed = {"type": "allowed_tools", "tools": [{"type": "function", "name": "get_time"}], "mode": "required"}
    out = infer(tools=[WEATHER, TIME], tool_choice=allowed)
    assert len(out.tools) == 2  # every tool stays in the prompt; the choice narrows what may be called
    assert (out.tool_choice.mode, out.tool_choice.function_name) == (pb.TOOL_CHOICE_MODE_FUNCTION, "get_time")
    both = {**allowed, "tools": [{"type": "function", "name": "get_time"}, {"type": "function", "name": "get_weather"}]}
    assert infer(tools=[WEATHER, TIME], tool_choice=both).tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED


def test_reasoning_effort_reaches_the_template():
    assert json.loads(infer(reasoning={"effort": "high"}).chat.chat_template_kwargs_json) == {
        "reasoning_effort": "high", "enable_thinking": True}
    assert json.loads(infer(reasoning={"effort": "none"}).chat.chat_template_kwargs_json)["enable_thinking"] is False
    assert infer(reasoning={"summary": "auto"}).chat.chat_template_kwargs_json == ""


# ---- the response object -----------------------------------------------------------------------

def test_text_response():
    out = assemble(TEXT, metadata={"team": "a"}, instructions="Be kind.", temperature=0.2, max_output_tokens=99)
    parsed = check_response(out)
    assert (parsed.id, parsed.object, parsed.created_at, parsed.status, parsed.model) == (
        "resp_1", "response", 123, "completed", "tiny")
    assert parsed.output_text == "Hello, world" and out["completed_at"] is not None
    message = out["output"][0]
    assert (message["type"], message["role"], message["status"], message["id"][:4]) == (
        "message", "assistant", "completed", "msg_")
    assert message["content"] == [{"type": "output_text", "text": "Hello, world", "annotations": [], "logprobs": []}]
    assert out["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                            "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": 12}
    assert (out["metadata"], out["instructions"], out["temperature"], out["max_output_tokens"]) == (
        {"team": "a"}, "Be kind.", 0.2, 99)
    assert (out["error"], out["incomplete_details"], out["store"], out["background"]) == (None, None, True, False)


def test_reasoning_and_text_response():
    out = assemble(THINKING, reasoning={"effort": "medium", "summary": "auto"})
    check_response(out)
    reasoning, message = out["output"]
    assert (reasoning["type"], reasoning["status"], reasoning["id"][:3]) == ("reasoning", "completed", "rs_")
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert message["content"][0]["text"] == "42"
    assert out["usage"]["output_tokens_details"] == {"reasoning_tokens": 3}
    assert out["reasoning"] == {"effort": "medium", "summary": "auto"}


def test_function_call_response():
    out = assemble(TOOL_CALLS, tools=[WEATHER, TIME])
    parsed = check_response(out)
    assert [(o["type"], o["call_id"], o["name"], o["arguments"], o["status"]) for o in out["output"]] == [
        ("function_call", "call_a", "get_weather", '{"city": "Paris"}', "completed"),
        ("function_call", "call_b", "get_time", "{}", "completed")]
    assert all(o["id"].startswith("fc_") for o in out["output"]) and parsed.status == "completed"
    assert out["tools"][1] == {"type": "function", "name": "get_time", "description": None,
                               "parameters": TIME["parameters"], "strict": None}
    assert out["tool_choice"] == "auto"


def test_max_output_tokens_makes_it_incomplete():
    out = assemble(TRUNCATED, max_output_tokens=16)
    parsed = check_response(out)
    assert (parsed.status, out["incomplete_details"], out["completed_at"]) == (
        "incomplete", {"reason": "max_output_tokens"}, None)
    assert out["output"][0]["status"] == "incomplete" and parsed.output_text == "Once upon a time"


def test_worker_error_makes_it_failed():
    out = assemble(BROKEN)
    parsed = check_response(out)
    assert parsed.status == "failed" and out["error"]["code"] == "server_error"
    assert out["output"][0]["status"] == "incomplete" and out["usage"]["output_tokens"] == 7


def test_cancelled_and_unfinished_responses():
    out = assemble([delta("par"), final(pb.FINISH_REASON_CANCELLED)])
    assert check_response(out).status == "cancelled" and out["incomplete_details"] is None
    out = assemble([delta("par")])  # the stream ended without a Final
    assert check_response(out).status == "failed" and out["usage"] is None


def test_an_empty_answer_is_an_empty_message():
    out = assemble([final()])
    assert check_response(out).output_text == "" and out["output"][0]["content"][0]["text"] == ""
    out = assemble([delta(reasoning="hmm"), final()])
    assert [o.type for o in check_response(out).output] == ["reasoning", "message"]


def test_echo_of_every_request_field():
    req = request(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, top_logprobs=2,
                  text={"format": {"type": "json_object"}, "verbosity": "low"}, truncation="auto",
                  previous_response_id="resp_0", store=False, prompt_cache_key="k", safety_identifier="s",
                  max_tool_calls=2, parallel_tool_calls=False, presence_penalty=0.5, user="u")
    asm = ResponseAssembler.for_request(req)
    for event in TEXT:
        asm.add(event)
    out = asm.result()
    check_response(out)
    assert out["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert out["text"] == {"format": {"type": "json_object"}, "verbosity": "low"}
    assert (out["truncation"], out["previous_response_id"], out["store"], out["prompt_cache_key"]) == (
        "auto", "resp_0", False, "k")
    assert (out["top_logprobs"], out["max_tool_calls"], out["parallel_tool_calls"], out["presence_penalty"]) == (
        2, 2, False, 0.5)
    assert (out["top_p"], out["frequency_penalty"], out["service_tier"], out["user"]) == (1.0, 0.0, "default", "u")
    defaults = echo_fields(request(), defaults={"temperature": 0.6, "top_p": 0.95})
    assert (defaults["temperature"], defaults["top_p"]) == (0.6, 0.95)


def test_allowed_tools_echo_and_enforcement():
    allowed = {"type": "allowed_tools", "tools": [{"type": "function", "name": "get_time"}], "mode": "auto"}
    out = assemble(TOOL_CALLS, tools=[WEATHER, TIME], tool_choice=allowed)
    check_response(out)
    assert out["tool_choice"] == {"type": "allowed_tools", "mode": "auto",
                                  "tools": [{"type": "function", "name": "get_time"}]}
    assert [o["name"] for o in out["output"]] == ["get_time"]  # the call to get_weather is dropped
    none = assemble(TEXT, tools=[WEATHER], tool_choice={**allowed, "tools": [{"type": "function",
                                                                                "name": "get_weather"}],
                                                        "mode": "none"})
    assert check_response(none).tool_choice == "none"


def test_json_schema_echo_follows_the_spec():
    """The spec's response-side `JsonSchemaResponseFormat` holds `schema: null`; the openai SDK's
    type wants the schema object. We follow the spec (the SDK client itself does not validate)."""
    out = assemble(TEXT, text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}})
    assert spec_errors(RESPONSE_SCHEMA, out) == []
    assert out["text"]["format"] == {"type": "json_schema", "name": "out", "description": None, "schema": None,
                                     "strict": False}
    with pytest.raises(ValidationError):
        Response.model_validate(out)
    assert Response.construct(**out).output_text == "Hello, world"  # what the SDK's client does


def test_logprobs_when_included():
    lp = pb.TokenLogprob(token="Hi", logprob=-0.5, bytes=b"Hi", top=[pb.TopLogprob(token="Yo", logprob=-1.0)])
    out = assemble([delta("Hi", logprobs=[lp]), final()], include=["message.output_text.logprobs"], top_logprobs=1)
    check_response(out)
    assert out["output"][0]["content"][0]["logprobs"] == [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
         "top_logprobs": [{"token": "Yo", "logprob": -1.0, "bytes": [89, 111]}]}]
    plain = assemble([delta("Hi", logprobs=[lp]), final()])
    assert plain["output"][0]["content"][0]["logprobs"] == []


# ---- the event stream --------------------------------------------------------------------------

def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_text_stream():
    enc, events = stream(TEXT)
    check_events(events)
    assert kinds(events) == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hello", ", world"]
    added, done = events[2], events[8]
    assert (added["item"]["status"], added["item"]["content"], done["item"]["status"]) == (
        "in_progress", [], "completed")
    assert events[-1]["response"] == enc.response and enc.done
    assert check_response(enc.response).output_text == "Hello, world"


def test_reasoning_stream():
    enc, events = stream(THINKING)
    check_events(events)
    assert kinds(events)[2:9] == [
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1]
    assert events[6]["text"] == "Let me think." and events[8]["item"]["summary"][0]["text"] == "Let me think."
    check_response(enc.response)


def test_function_call_stream():
    enc, events = stream(TOOL_CALLS, tools=[WEATHER, TIME])
    check_events(events)
    assert kinds(events)[2:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    first = events[2]["item"]
    assert (first["call_id"], first["name"], first["arguments"], first["status"]) == (
        "call_a", "get_weather", "", "in_progress")
    assert events[5]["arguments"] == '{"city": "Paris"}' and events[6]["item"]["arguments"] == '{"city": "Paris"}'
    assert {e["item_id"] for e in events[3:6]} == {first["id"]}
    check_response(enc.response)


def test_incomplete_stream():
    _, events = stream(TRUNCATED, max_output_tokens=16)
    check_events(events)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


def test_failed_stream():
    enc, events = stream(BROKEN)
    check_events(events)
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"] == "server_error"
    assert enc.encode(delta("late")) == [] and enc.fail() == []  # nothing after the terminal event


def test_cancelled_stream_ends_incomplete_with_status_cancelled():
    enc, events = stream([delta("par"), final(pb.FINISH_REASON_CANCELLED)])
    check_events(events)
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "cancelled"
    enc, events = stream([delta("par")])
    events += enc.cancel()
    check_events(events)
    assert enc.status == "cancelled"


def test_a_broken_call_fails_the_stream_with_an_error_event_first():
    enc, events = stream([delta(reasoning="hmm"), delta("Hal")])
    err = OpenAIError(503, "The model is temporarily unavailable.", type="server_error", code="service_unavailable")
    events += [enc.error_event(err), *enc.fail(err)]
    check_events(events)
    assert kinds(events)[-5:] == ["error", "response.output_text.done", "response.content_part.done",
                                  "response.output_item.done", "response.failed"]
    assert events[-2]["item"]["status"] == "incomplete"
    assert events[-5]["error"] == {"type": "server_error", "code": "service_unavailable",
                                   "message": "The model is temporarily unavailable.", "param": None}
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": events[-1]["response"]["error"][
        "message"]}
    limited = ResponseStreamEncoder("tiny")
    limited.start()
    failed = limited.fail(OpenAIError(429, "Slow down.", type="rate_limit_error"))
    assert failed[-1]["response"]["error"] == {"code": "rate_limit_exceeded", "message": "Slow down."}
    check_response(failed[-1]["response"])


def test_sequence_numbers_continue_from_a_replay():
    enc, events = stream(TEXT, start=41)
    check_events(events, start=41)
    assert enc.sequence_number == 41 + len(events)


def test_queued_start():
    enc = ResponseStreamEncoder.for_request(request(background=True))
    events = enc.start(queued=True)
    assert kinds(events) == ["response.created", "response.queued"]
    assert events[0]["response"]["status"] == "queued" and events[0]["response"]["background"] is True
    events += enc.in_progress()
    for event in TEXT:
        events += enc.encode(event)
    check_events(events)
    assert kinds(events)[2] == "response.in_progress"


def test_interleaved_kinds_open_new_items():
    enc, events = stream([delta("Let me check."), delta(calls=[call(0, "{}", id="c", name="get_time")]),
                          delta("Done."), delta(calls=[call(0, " ")]), final(TOOLS)], tools=[TIME])
    check_events(events)
    assert [o["type"] for o in enc.response["output"]] == ["message", "function_call", "message"]
    assert enc.response["output"][1]["arguments"] == "{} "  # a late fragment completes its (closed) item


def test_error_event_shape():
    event = error_event(OpenAIError(400, "Bad input.", param="input", code="invalid_value"), 3)
    assert spec_errors(EVENT_SCHEMA, event) == []
    parsed = SDK_EVENT.validate_python(event)
    assert (parsed.code, parsed.message, parsed.param, parsed.sequence_number) == (
        "invalid_value", "Bad input.", "input", 3)
    assert event["error"] == {"type": "invalid_request_error", "code": "invalid_value", "message": "Bad input.",
                              "param": "input"}


def test_sse_framing():
    frame = sse_response_event({"type": "response.output_text.delta", "sequence_number": 4, "delta": "é"})
    assert frame == ('event: response.output_text.delta\n'
                     'data: {"type":"response.output_text.delta","sequence_number":4,"delta":"é"}\n\n').encode()


def test_default_encoder_echo_is_complete():
    enc = ResponseStreamEncoder("tiny", response_id="resp_x", created_at=1)
    events = enc.start()
    for event in TEXT:
        events += enc.encode(event)
    check_events(events)
    assert check_response(enc.response).id == "resp_x"
