"""`/v1/responses` requests: validation (400s naming the field, read like OpenAI's) of the create and
compact bodies, checked against the saved Open Responses schema (tests/data/openresponses)."""

from __future__ import annotations

import pytest

from services.gateway.responses.protocol import parse_compact_request, parse_response_request
from services.gateway.responses.protocol_events import (
    echo_fields,
)
from tests.helpers import refused
from tests.openresponses import (
    CREATE_SCHEMA,
    spec_errors,
)
from tests.unit.responses_scripts import (
    WEATHER,
    body,
    request,
)

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


@pytest.mark.parametrize("parse", [parse_response_request, parse_compact_request])
@pytest.mark.parametrize("extra", [{}, {"input": None}])
def test_an_empty_previous_response_id_is_400(parse, extra):
    """Once accepted and echoed as "": a response that continues nothing, naming nothing."""
    err = refused(parse, {**body(), "previous_response_id": "", **extra})
    assert err.param == "previous_response_id" and "empty string" in err.message, err.message


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
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only 'function' and 'mcp' tools"),
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


def test_tool_choice_required_counts_an_mcp_servers_tools():
    mcp = {"type": "mcp", "server_label": "w", "server_url": "http://127.0.0.1:1/mcp"}
    assert parse_response_request({**body(), "tools": [mcp], "tool_choice": "required"}).tool_choice == "required"
    err = refused(parse_response_request, {**body(), "tools": [], "tool_choice": "required"})
    assert err.param == "tool_choice" and "only allowed when 'tools'" in err.message


@pytest.mark.parametrize(("ids", "param", "words"), [
    (["msg_1", "msg_1"], "input[1].id", "Duplicate item found with id msg_1"),
    ([None, "fc_1", "msg_2", "fc_1"], "input[3].id", "Duplicate item found with id fc_1"),
    (["msg_1", ""], "input[1].id", "empty string"),
])
def test_input_item_ids_are_distinct_and_not_empty(ids, param, words):
    """Stored input items are paged by id: the store refused these only after the generation ran."""
    items = [{"type": "message", "role": "user", "content": "x"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]
    given = [{**items[i % 2], **({"id": item_id} if item_id is not None else {})} for i, item_id in enumerate(ids)]
    err = refused(parse_response_request, {**body(), "input": given})
    assert err.param == param and words in err.message, (err.param, err.message)
    assert refused(parse_compact_request, {"model": "m", "input": given}).param == param
    assert len(request(input=[{**items[0], "id": "a"}, {**items[0], "id": "b"}, items[0], items[0]]).input_items) == 4


def test_an_mcp_servers_url_is_echoed_without_its_secrets():
    """Responses are stored and read back: a key in the URL's query must not be."""
    from services.gateway.responses.protocol_mcp_events import McpStreamEncoder

    url = "https://mcp.example.com:8443/mcp?api_key=sek-123&region=eu"
    req = parse_response_request({"model": "m", "input": "hi", "tools": [
        {"type": "mcp", "server_label": "w", "server_url": url, "require_approval": "never"}]})
    (echoed,) = McpStreamEncoder.for_request(req).response["tools"]
    assert echoed["server_url"] == "https://mcp.example.com:8443/mcp?api_key=REDACTED&region=REDACTED"
