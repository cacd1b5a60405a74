"""`/v1/responses` results: the response object and its event stream built from scripted worker events,
each checked against the saved Open Responses schema and parsed with the `openai` package's types."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response
from pydantic import ValidationError

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.edge.sse import sse_response_event
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.protocol_events import (
    ResponseAssembler,
    ResponseStreamEncoder,
    echo_fields,
    error_event,
)
from tests.openresponses import (
    EVENT_SCHEMA,
    RESPONSE_SCHEMA,
    SDK_EVENT,
    SPEC,
    check_events,
    check_response,
    spec_errors,
)
from tests.unit.responses_scripts import (
    BROKEN,
    TEXT,
    THINKING,
    TIME,
    TOOL_CALLS,
    TRUNCATED,
    WEATHER,
    assemble,
    request,
    stream,
)
from tests.unit.worker_events import TOOLS, call, delta, final


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
