"""`/v1/responses` input items: their chat messages and the `pb.InferRequest` of a turn."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.protocol import parse_response_request
from services.gateway.responses.protocol import to_infer_request as responses_infer_request
from services.gateway.responses.protocol_items import to_messages
from tests.unit.responses_scripts import THINKING, TIME, WEATHER, assemble, request

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
    with pytest.raises(OpenAIError) as e:
        parse_response_request(b'{"model": "m", "input": "\\ud800"}')
    assert (e.value.status, e.value.code) == (400, "invalid_unicode")


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
