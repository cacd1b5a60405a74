"""The gateway's OpenAI protocol layer: request validation (400s naming the field), conversion to
`pb.InferRequest`, and the response objects built from scripted worker events, checked against the
official `openai` package's types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import openai.types
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.errors import OpenAIError
from services.gateway.protocol import (
    SSE_DONE,
    ChatCompletionAssembler,
    ChatStreamEncoder,
    CompletionAssembler,
    CompletionStreamEncoder,
    parse_chat_request,
    parse_completion_request,
    sse_event,
    to_infer_request,
)

USER = {"role": "user", "content": "hi"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [USER], **kw}


def chat_infer(**kw: Any) -> pb.InferRequest:
    return to_infer_request(parse_chat_request(chat_body(**kw)), request_id="r1", cache_salt="salt")


def completion_infer(**kw: Any) -> pb.InferRequest:
    body = {"model": "tiny", "prompt": "Once", **kw}
    return to_infer_request(parse_completion_request(body), request_id="r1", cache_salt=None)


def refused(parse, body: dict[str, Any] | bytes) -> OpenAIError:
    with pytest.raises(OpenAIError) as e:
        parse(body)
    assert e.value.status == 400, e.value
    assert e.value.body()["error"]["type"] == "invalid_request_error"
    return e.value


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


def test_unknown_completion_field():
    err = refused(parse_completion_request, {"model": "m", "prompt": "x", "messages": []})
    assert err.param == "messages"


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
    req = parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}')
    with pytest.raises(OpenAIError) as e:
        to_infer_request(req, request_id="r", cache_salt=None)
    assert e.value.status == 400


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


# ---- completions requests ----------------------------------------------------------------------------

def test_completion_prompt_forms():
    assert completion_infer().prompt == pb.PromptInput(text="Once")
    assert completion_infer(prompt=["Once"]).prompt == pb.PromptInput(text="Once")
    assert completion_infer(prompt=[1, 2, 3]).prompt == pb.PromptInput(token_ids=[1, 2, 3])
    assert completion_infer(prompt=[[4, 5]]).prompt == pb.PromptInput(token_ids=[4, 5])
    req = completion_infer(max_tokens=5, logprobs=2, temperature=0, echo=False, best_of=1, stop=["\n"])
    assert (req.sampling.max_tokens, req.sampling.top_logprobs, req.sampling.logprobs) == (5, 2, True)
    assert not req.parse_reasoning and req.cache_salt == ""
    assert not completion_infer(logprobs=None).sampling.logprobs


@pytest.mark.parametrize(("extra", "param"), [
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt[1]"),
    ({"prompt": [-1]}, "prompt[0]"),
    ({"prompt": [True]}, "prompt[0]"),
    ({"suffix": "tail"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"prompt": [1, 2], "echo": True}, "echo"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"temperature": 3}, "temperature"),
    ({"logit_bias": {"1": 1}}, "logit_bias"),
])
def test_completion_refusals(extra, param):
    assert refused(parse_completion_request, {"model": "m", "prompt": "x", **extra}).param == param


def test_completion_best_of_equal_to_n_is_fine():
    assert completion_infer(n=2, best_of=2).sampling.n == 2


# ---- scripted worker events ----------------------------------------------------------------------------

def delta(text: str = "", *, index: int = 0, reasoning: str = "", calls: list[pb.ToolCallDelta] | None = None,
          logprobs: list[pb.TokenLogprob] | None = None) -> pb.InferEvent:
    return pb.InferEvent(delta=pb.Delta(index=index, text=text, reasoning=reasoning, tool_calls=calls or [],
                                        logprobs=logprobs or [], token_count=1))


def final(*reasons: int, prompt: int = 5, completion: int = 7, cached: int = 2, reasoning: int = 0) -> pb.InferEvent:
    return pb.InferEvent(final=pb.Final(
        choices=[pb.ChoiceFinish(index=i, finish_reason=r) for i, r in enumerate(reasons)],
        usage=common_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                               reasoning_tokens=reasoning)))


def lp(token: str, logprob: float, *top: tuple[str, float]) -> pb.TokenLogprob:
    return pb.TokenLogprob(token=token, logprob=logprob, bytes=token.encode(),
                           top=[pb.TopLogprob(token=t, logprob=v, bytes=t.encode()) for t, v in top])


STOP, LENGTH, TOOLS = pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_TOOL_CALLS
TEXT = [delta("Hello"), delta(", world"), final(STOP)]
THINKING = [delta(reasoning="Let me "), delta(reasoning="think."), delta("42"), final(STOP, reasoning=3)]
TOOL_CALL = [delta(calls=[pb.ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city": ')]),
             delta(calls=[pb.ToolCallDelta(index=0, arguments='"Paris"}')]),
             delta(calls=[pb.ToolCallDelta(index=1, id="call_b", name="get_time", arguments="{}")]),
             final(TOOLS)]


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


def test_sse_framing():
    frame = sse_event({"a": "é", "b": [1]})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert json.loads(frame[len(b"data: "):]) == {"a": "é", "b": [1]}
    assert SSE_DONE == b"data: [DONE]\n\n"


# ---- completions responses ---------------------------------------------------------------------------

def test_completion_text_and_usage():
    asm = CompletionAssembler("tiny", completion_id="cmpl-1", created=5)
    for event in TEXT:
        asm.add(event)
    parsed = openai.types.Completion.model_validate(asm.result())
    assert (parsed.id, parsed.object, parsed.model) == ("cmpl-1", "text_completion", "tiny")
    assert (parsed.choices[0].text, parsed.choices[0].finish_reason, parsed.choices[0].logprobs) == (
        "Hello, world", "stop", None)
    assert parsed.usage.total_tokens == 12


def test_completion_echo_n2_logprobs():
    req = parse_completion_request({"model": "tiny", "prompt": "Say:", "echo": True, "n": 2})
    asm = CompletionAssembler.for_request(req)
    for event in [delta(" hi", index=0), delta(" yo", index=1), final(STOP, LENGTH)]:
        asm.add(event)
    parsed = openai.types.Completion.model_validate(asm.result())
    assert [(c.text, c.finish_reason) for c in parsed.choices] == [("Say: hi", "stop"), ("Say: yo", "length")]

    asm = CompletionAssembler("tiny", logprobs=True)
    for event in [delta("Hi", logprobs=[lp("Hi", -0.1, ("Yo", -2.0))]), delta(" there", logprobs=[lp(" there", -0.2)]),
                  final(STOP)]:
        asm.add(event)
    logprobs = openai.types.Completion.model_validate(asm.result()).choices[0].logprobs
    assert logprobs.tokens == ["Hi", " there"] and logprobs.text_offset == [0, 2]
    assert logprobs.token_logprobs == [pytest.approx(-0.1), pytest.approx(-0.2)]
    assert logprobs.top_logprobs[0] == {"Yo": -2.0, "Hi": pytest.approx(-0.1)}  # the sampled token is included


def test_completion_tool_calls_finish_is_stop_and_error_raises():
    asm = CompletionAssembler("tiny")
    asm.add(final(TOOLS))
    assert asm.result()["choices"][0]["finish_reason"] == "stop"
    asm = CompletionAssembler("tiny")
    asm.add(final(pb.FINISH_REASON_ERROR))
    with pytest.raises(OpenAIError):
        asm.result()


def test_completion_stream():
    req = parse_completion_request({"model": "tiny", "prompt": "Say:", "echo": True, "stream": True,
                                    "stream_options": {"include_usage": True}})
    enc = CompletionStreamEncoder.for_request(req, completion_id="cmpl-s", created=1)
    chunks = [c for event in [delta(" hi"), delta("!"), final(STOP)] for c in enc.encode(event)]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Say: hi", "!", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "stop"]
    assert all(c["usage"] is None and (c["id"], c["object"]) == ("cmpl-s", "text_completion") for c in chunks[:-1])
    openai.types.Completion.model_validate(chunks[-2])  # the closing chunk is a complete Completion
    last = openai.types.Completion.model_validate(chunks[-1])
    assert last.choices == [] and last.usage.total_tokens == 12
    for c in chunks[:-2]:  # mid-stream chunks carry finish_reason null, as OpenAI streams them
        openai.types.Completion.model_validate({**c, "choices": [{**c["choices"][0], "finish_reason": "stop"}]})


def test_completion_stream_logprobs_offsets_continue():
    enc = CompletionStreamEncoder("tiny", logprobs=True)
    first = enc.encode(delta("ab", logprobs=[lp("a", -1.0), lp("b", -1.0)]))[0]
    second = enc.encode(delta("c", logprobs=[lp("c", -1.0)]))[0]
    assert first["choices"][0]["logprobs"]["text_offset"] == [0, 1]
    assert second["choices"][0]["logprobs"]["text_offset"] == [2]
    assert "usage" not in first


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
            seen.append(to_infer_request(req, request_id="r", cache_salt="s"))
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
