"""Chat requests (and what chat and completions share): validation (400s naming the field, read like
OpenAI's) and conversion to `pb.InferRequest`."""

from __future__ import annotations

import json

import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.chat.protocol import parse_chat_request
from services.gateway.completions.protocol import (
    parse_completion_request,
)
from services.gateway.protocol_common.openai_error import OpenAIError
from tests.helpers import refused
from tests.unit.chat_requests import USER, WEATHER, chat_body, chat_infer

# ---- request validation ----------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "param"), [
    ({"foo": 1}, "foo"),
    ({"cache_salt": "mine"}, "cache_salt"),  # the edge derives it; clients cannot pick one
    ({"priority": 5}, "priority"),
    ({"messages": [{**USER, "foo": 1}]}, "messages[0].foo"),
    ({"tools": [{**WEATHER, "extra": True}]}, "tools[0].extra"),
    ({"stream": True, "stream_options": {"include_usage": True, "bogus": 1}}, "stream_options.bogus"),
])
def test_unknown_fields_are_400_naming_them(extra, param):
    err = refused(parse_chat_request, chat_body(**extra))
    assert err.param == param
    assert err.message == f"Unrecognized request argument supplied: {param}"




@pytest.mark.parametrize(("extra", "param"), [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"n": True}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"logprobs": 1}, "logprobs"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", 1]}, "stop[1]"),
    ({"model": 3}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [5]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": "x"}]}, "messages[1].tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tool_choice": 3}, "tool_choice"),
    ({"tool_choice": {"type": "function"}, "tools": [WEATHER]}, "tool_choice.function"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
     "response_format.json_schema.schema"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"logit_bias": {"1": "x"}}, "logit_bias.1"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ({"seed": 2**64}, "seed"),
])
def test_wrong_types_and_shapes_name_the_field_path(extra, param):
    assert refused(parse_chat_request, chat_body(**extra)).param == param


def test_missing_required_fields():
    err = refused(parse_chat_request, {"messages": [USER]})
    assert (err.param, err.message) == ("model", "Missing required parameter: 'model'.")
    assert refused(parse_chat_request, {"model": "m"}).param == "messages"
    assert refused(parse_completion_request, {"model": "m"}).param == "prompt"


def test_type_error_message_reads_like_openai():
    err = refused(parse_chat_request, chat_body(temperature="hot"))
    assert err.message == "Invalid type for 'temperature': expected a decimal, but got a string instead."


def test_ints_for_floats_are_fine():
    req = parse_chat_request(chat_body(temperature=1, top_p=1, presence_penalty=-2, frequency_penalty=2, min_p=0))
    assert req.temperature == 1.0 and isinstance(req.temperature, float)


@pytest.mark.parametrize(("extra", "param"), [
    ({"temperature": -0.1}, "temperature"), ({"temperature": 2.01}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"), ({"n": 2**31}, "n"),
    ({"presence_penalty": -2.5}, "presence_penalty"), ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"), ({"frequency_penalty": 2.1}, "frequency_penalty"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"top_k": -2}, "top_k"), ({"min_p": 1.1}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 9, "max_completion_tokens": 8}, "min_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": ""}, "stop"), ({"stop": ["a", ""]}, "stop"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_range_checks(extra, param):
    assert refused(parse_chat_request, chat_body(**extra)).param == param


def test_range_message_names_the_bound():
    err = refused(parse_chat_request, chat_body(temperature=2.5))
    assert err.message == "Invalid 'temperature': above maximum value. Expected a value <= 2, but got 2.5 instead."


@pytest.mark.parametrize("extra", [
    {"temperature": 0}, {"temperature": 2}, {"top_p": 1}, {"top_p": 0.01}, {"n": 1},
    {"presence_penalty": -2}, {"frequency_penalty": 2}, {"logprobs": True, "top_logprobs": 0},
    {"logprobs": True, "top_logprobs": 20}, {"top_k": -1}, {"top_k": 0}, {"min_p": 1}, {"min_tokens": 0},
    {"stop": ["a", "b", "c", "d"]}, {"seed": -1},
])
def test_bounds_themselves_are_accepted(extra):
    parse_chat_request(chat_body(**extra))


@pytest.mark.parametrize(("extra", "param"), [
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"audio": {"format": "wav", "voice": "alloy"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"modalities": ["video"]}, "modalities[0]"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}, "tools": [WEATHER]}, "tool_choice.type"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [USER, {"role": "assistant", "content": "x", "audio": {"id": "a"}}]}, "messages[1].audio"),
    ({"messages": [USER, {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]},
     "messages[1].function_call"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}}]}]}, "messages[1].tool_calls[0].type"),
    ({"continue_final_message": True}, "continue_final_message"),
])
def test_what_we_cannot_honour_is_refused_clearly(extra, param):
    assert refused(parse_chat_request, chat_body(**extra)).param == param


def test_function_role_is_refused():
    err = refused(parse_chat_request, chat_body(messages=[USER, {"role": "function", "name": "f", "content": "1"}]))
    assert err.param == "messages[1].role"
    assert "deprecated" in err.message
    err = refused(parse_chat_request, chat_body(messages=[{"role": "robot", "content": "x"}]))
    assert err.param == "messages[0].role" and "'robot'" in err.message


def test_accepted_and_ignored_fields():
    req = chat_infer(metadata={"k": "v"}, store=False, service_tier="auto", user="u1", verbosity="low",
                     prediction={"type": "content", "content": "draft"}, logit_bias={}, modalities=["text"],
                     stream=True, stream_options={"include_usage": True, "include_obfuscation": False},
                     prompt_cache_key="k", safety_identifier="s", prompt_cache_retention="24h", audio=None,
                     parallel_tool_calls=False,
                     messages=[{"role": "user", "content": [{"type": "text", "text": "x",
                                                              "prompt_cache_breakpoint": {"mode": "explicit"}}]}])
    assert req.chat.messages[0].parts.parts[0].text == "x"
    assert not req.parallel_tool_calls


def test_bad_json_and_non_object_bodies():
    err = refused(parse_chat_request, b'{"model": ')
    assert err.code == "invalid_json" and err.message.startswith("We could not parse the JSON body")
    assert refused(parse_chat_request, b"[1]").message == "The request body must be a JSON object."


def test_unencodable_text_is_400_not_500():
    """A lone surrogate anywhere (a value, a key, the model name) is refused at parsing; a pair is a character."""
    for body in (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
                 b'{"model": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}',
                 b'{"model": "m", "messages": [{"role": "user", "content": "hi", "\\uD83D": 1}]}'):
        with pytest.raises(OpenAIError) as e:
            parse_chat_request(body)
        assert (e.value.status, e.value.code) == (400, "invalid_unicode")
    req = parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}')
    assert req.messages[0].content == "\U0001f600"


def test_a_body_is_strict_utf8():
    """JSON is UTF-8: UTF-16/32 (which `json.loads` would sniff, hiding a `\\ud800` from the surrogate
    check) and UTF-8-encoded surrogates are invalid_json; a UTF-8 byte order mark is skipped."""
    text = '{"model": "m", "messages": [{"role": "user", "content": "h\u00e9 \\ud800"}]}'
    for body in (text.encode("utf-16"), text.encode("utf-16-le"), text.encode("utf-32"),
                 text.replace(" \\ud800", "").encode("utf-16"),
                 b'{"model": "m", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'):
        with pytest.raises(OpenAIError) as e:
            parse_chat_request(body)
        assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_json", None), body
    req = parse_chat_request(b"\xef\xbb\xbf" + text.replace(" \\ud800", "").encode())
    assert req.messages[0].content == "h\u00e9"


# ---- conversion ------------------------------------------------------------------------------------

def test_minimal_chat_request():
    req = chat_infer()
    assert (req.request_id, req.model, req.cache_salt) == ("r1", "tiny", "salt")
    assert req.parse_reasoning and req.parallel_tool_calls
    assert req.WhichOneof("input") == "chat" and not req.HasField("response_format")
    assert req.tool_choice.mode == pb.TOOL_CHOICE_MODE_UNSPECIFIED
    assert req.sampling == pb.SamplingParams()  # unset = engine defaults
    assert req.chat.chat_template_kwargs_json == ""


def test_messages_of_every_role():
    messages = [
        {"role": "system", "content": "be brief", "name": "sys"},
        {"role": "developer", "content": [{"type": "text", "text": "dev rules"}]},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA",
                                                                         "detail": "low"}}], "name": "ann"},
        {"role": "assistant", "content": None, "reasoning_content": "thinking",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is "}, {"type": "refusal", "refusal": "no"}]},
        {"role": "assistant", "refusal": "I can't"},
    ]
    out = chat_infer(messages=messages).chat.messages
    assert [m.role for m in out] == ["system", "developer", "user", "assistant", "tool", "assistant", "assistant"]
    assert (out[0].content, out[0].name) == ("be brief", "sys")
    assert [p.text for p in out[1].parts.parts] == ["dev rules"]
    assert out[2].name == "ann"
    assert [p.WhichOneof("part") for p in out[2].parts.parts] == ["text", "image_url"]
    assert out[2].parts.parts[1].image_url == "data:image/png;base64,AA"
    assert out[3].WhichOneof("body") is None and out[3].reasoning == "thinking"
    assert out[3].tool_calls[0] == pb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    assert (out[4].tool_call_id, out[4].content) == ("call_1", "sunny")
    assert [p.text for p in out[5].parts.parts] == ["It is ", "no"]
    assert out[6].content == "I can't"


def test_tools_and_tool_choice():
    req = chat_infer(tools=[WEATHER, {"type": "function", "function": {"name": "noop"}}])
    assert [t.name for t in req.tools] == ["get_weather", "noop"]
    assert req.tools[0].description == "Weather in a city"
    assert json.loads(req.tools[0].parameters_json) == WEATHER["function"]["parameters"]
    assert req.tools[1].parameters_json == ""  # the worker's default: {"type": "object"}
    modes = {"none": pb.TOOL_CHOICE_MODE_NONE, "auto": pb.TOOL_CHOICE_MODE_AUTO,
             "required": pb.TOOL_CHOICE_MODE_REQUIRED}
    for choice, mode in modes.items():
        assert chat_infer(tools=[WEATHER], tool_choice=choice).tool_choice.mode == mode
    named = chat_infer(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.tool_choice == pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name="get_weather")
    assert chat_infer(tool_choice="none").tool_choice.mode == pb.TOOL_CHOICE_MODE_NONE  # fine without tools


def test_named_tool_choice_must_be_a_given_tool():
    err = refused(parse_chat_request, chat_body(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "nope"}}))
    assert err.param == "tool_choice" and "nope" in err.message
    assert refused(parse_chat_request, chat_body(tool_choice="required")).param == "tool_choice"


def test_response_formats():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = chat_infer(response_format={"type": "json_schema", "json_schema": {
        "name": "thing", "description": "d", "schema": schema, "strict": True}}).response_format
    assert fmt.WhichOneof("format") == "json_schema"
    assert (fmt.json_schema.name, fmt.json_schema.strict) == ("thing", True)
    assert json.loads(fmt.json_schema.schema_json) == schema
    no_schema = chat_infer(response_format={"type": "json_schema", "json_schema": {"name": "x"}}).response_format
    assert json.loads(no_schema.json_schema.schema_json) == {} and not no_schema.json_schema.strict
    assert chat_infer(response_format={"type": "json_object"}).response_format == pb.ResponseFormat(json_object=True)
    assert chat_infer(response_format={"type": "text"}).response_format == pb.ResponseFormat(text=True)
    assert refused(parse_chat_request, chat_body(response_format={"type": "json_schema", "json_schema": {
        "name": "has space"}})).param == "response_format.json_schema.name"


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat_infer(max_tokens=10, max_completion_tokens=20).sampling.max_tokens == 20
    assert chat_infer(max_tokens=10).sampling.max_tokens == 10
    assert chat_infer(max_completion_tokens=7).sampling.max_tokens == 7
    assert not chat_infer().sampling.HasField("max_tokens")
    parse_chat_request(chat_body(max_tokens=4, max_completion_tokens=9, min_tokens=9))  # checked against the winner


def test_sampling_fields_and_vllm_extras():
    s = chat_infer(temperature=0.5, top_p=0.9, n=2, stop="END", seed=7, presence_penalty=0.5, frequency_penalty=-0.5,
                   logprobs=True, top_logprobs=3, top_k=40, min_p=0.05, repetition_penalty=1.1, ignore_eos=True,
                   min_tokens=2, stop_token_ids=[5, 6], skip_special_tokens=False,
                   include_stop_str_in_output=True).sampling
    assert list(s.stop) == ["END"] and list(s.stop_token_ids) == [5, 6]
    assert (s.n, s.seed, s.top_k, s.min_tokens, s.top_logprobs) == (2, 7, 40, 2, 3)
    assert s.temperature == pytest.approx(0.5) and s.top_p == pytest.approx(0.9)
    assert s.presence_penalty == pytest.approx(0.5) and s.frequency_penalty == pytest.approx(-0.5)
    assert s.min_p == pytest.approx(0.05) and s.repetition_penalty == pytest.approx(1.1)
    assert s.logprobs and s.ignore_eos and s.keep_special_tokens and s.include_stop_str_in_output
    assert list(chat_infer(stop=["a", "b"]).sampling.stop) == ["a", "b"]
    plain = chat_infer(logprobs=True).sampling
    assert plain.logprobs and not plain.HasField("top_logprobs")


def test_reasoning_effort_and_template_kwargs():
    kwargs = json.loads(chat_infer(reasoning_effort="none").chat.chat_template_kwargs_json)
    assert kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    req = chat_infer(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False, "x": 1})
    kwargs = json.loads(req.chat.chat_template_kwargs_json)
    assert kwargs == {"reasoning_effort": "high", "enable_thinking": False, "x": 1}  # the caller's kwargs win
    assert refused(parse_chat_request, chat_body(reasoning_effort="extreme")).param == "reasoning_effort"


def test_continue_final_message():
    req = chat_infer(messages=[USER, {"role": "assistant", "content": "Once upon"}], continue_final_message=True)
    assert req.chat.continue_final_message


@pytest.mark.parametrize(("extra", "param"), [
    ({"n": 129}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}] * 2049}, "messages"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x" * (20 * 2**20 + 1)}}]}]},
     "messages[0].content[0].image_url.url"),
])
def test_bounds_are_400s_naming_the_parameter(extra, param):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(OpenAIError) as e:
        parse_chat_request(json.dumps(body).encode())
    assert e.value.status == 400 and e.value.param == param
