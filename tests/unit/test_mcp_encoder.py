"""The MCP items and events of a response (protocol_mcp_events) and what they become in the next
generation's chat (protocol_items): synthetic worker events in, the Responses API's items and
events out, checked against the official SDK's types."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.mcp_loop import check_approvals, listed_in_chain
from services.gateway.responses.protocol_items import to_messages
from services.gateway.responses.protocol_mcp_events import McpStreamEncoder
from services.gateway.responses.protocol_mcp_items import DENIED

TOOLS = [{"name": "lookup_weather", "description": "Weather.", "input_schema": {"type": "object"},
          "annotations": None}]


def encoder(approval: bool = False) -> McpStreamEncoder:
    enc = McpStreamEncoder("tiny")
    enc.resolve = lambda name: ("weather", name, approval) if name == "lookup_weather" else None
    return enc


def call(name: str, arguments: str, index: int = 0) -> pb.InferEvent:
    return pb.InferEvent(delta=pb.Delta(tool_calls=[pb.ToolCallDelta(index=index, id="call_1", name=name,
                                                                     arguments=arguments)]))


def final(reason: int = pb.FINISH_REASON_TOOL_CALLS, tokens: int = 5) -> pb.InferEvent:
    return pb.InferEvent(final=pb.Final(choices=[pb.ChoiceFinish(index=0, finish_reason=reason)],
                                        usage=common_pb2.Usage(prompt_tokens=10, completion_tokens=tokens)))


def kinds(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def test_list_call_answer_in_order_and_usage_summed():
    enc = encoder()
    events = enc.start()
    item, out = enc.list_started("weather")
    events += out + enc.list_done(item, TOOLS)
    events += enc.encode(call("lookup_weather", '{"city": ')) + enc.encode(call("lookup_weather", '"Oslo"}'))
    events += enc.encode(final())
    assert not enc.done and [i.name for i in enc.pending] == ["lookup_weather"]  # the loop runs it next
    (pending,) = enc.take_pending()
    events += enc.call_done(pending, "Sunny")
    events += enc.encode(pb.InferEvent(delta=pb.Delta(text="The tool says: Sunny.")))
    events += enc.encode(final(pb.FINISH_REASON_STOP, tokens=7))
    assert enc.done and enc.status == "completed"
    assert kinds(events) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added", "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done", "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    response = events[-1]["response"]
    Response.model_validate(response)
    listing, mcp_call, message = response["output"]
    assert (listing["type"], listing["tools"][0]["name"], listing["error"]) == ("mcp_list_tools", "lookup_weather",
                                                                               None)
    assert (mcp_call["type"], mcp_call["arguments"], mcp_call["output"], mcp_call["status"]) == \
        ("mcp_call", '{"city": "Oslo"}', "Sunny", "completed")
    assert mcp_call["id"].startswith("mcp_") and listing["id"].startswith("mcpl_")
    assert message["content"][0]["text"] == "The tool says: Sunny."
    assert response["usage"]["output_tokens"] == 12 and response["usage"]["input_tokens"] == 20  # both generations


def test_every_generation_numbers_its_calls_from_zero():
    """The worker numbers a generation's calls from 0: a call in the next generation is a new item,
    never more arguments for the last generation's call."""
    enc = encoder()
    enc.start()
    events = []
    for city, output in (("Oslo", "Sunny"), ("Bergen", "Rain")):
        events += enc.encode(call("lookup_weather", f'{{"city": "{city}"}}')) + enc.encode(final())
        (pending,) = enc.take_pending()
        events += enc.call_done(pending, output)
    events += enc.encode(pb.InferEvent(delta=pb.Delta(text="Sunny, then rain."))) + enc.encode(
        final(pb.FINISH_REASON_STOP))
    assert enc.done and enc.status == "completed"
    calls = [i for i in events[-1]["response"]["output"] if i["type"] == "mcp_call"]
    assert [(c["arguments"], c["output"]) for c in calls] == [('{"city": "Oslo"}', "Sunny"),
                                                              ('{"city": "Bergen"}', "Rain")]
    assert kinds(events).count("response.mcp_call.completed") == 2
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "Sunny, then rain."


def test_an_approval_request_ends_the_response_and_nothing_is_pending():
    enc = encoder(approval=True)
    enc.start()
    events = enc.encode(call("lookup_weather", '{"city": "Oslo"}')) + enc.encode(final())
    assert enc.done and enc.status == "completed" and enc.pending == []
    assert kinds(events) == ["response.output_item.added", "response.output_item.done", "response.completed"]
    (request,) = events[-1]["response"]["output"]
    assert request["type"] == "mcp_approval_request" and request["id"].startswith("mcpr_")
    assert json.loads(request["arguments"]) == {"city": "Oslo"}
    Response.model_validate(events[-1]["response"])


def test_other_functions_stay_function_calls_and_end_the_response():
    enc = encoder()
    enc.start()
    events = enc.encode(call("client_side", "{}")) + enc.encode(final())
    assert enc.done and [i["type"] for i in events[-1]["response"]["output"]] == ["function_call"]


def test_a_failed_listing_fails_the_response_with_its_message():
    enc = encoder()
    enc.start()
    item, _ = enc.list_started("weather")
    events = enc.list_done(item, None, "unreachable") + enc.fail_dependency("Error retrieving tool list: x")
    assert kinds(events) == ["response.mcp_list_tools.failed", "response.output_item.done", "response.failed"]
    response = events[-1]["response"]
    assert response["error"]["message"] == "Error retrieving tool list: x" and enc.failed_dependency
    Response.model_validate(response)


def test_mcp_items_become_the_chat_of_the_next_generation():
    items = [{"type": "message", "role": "user", "content": "Weather in Oslo?"},
             {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "weather", "tools": TOOLS, "error": None},
             {"type": "mcp_call", "id": "mcp_1", "server_label": "weather", "name": "lookup_weather",
              "arguments": '{"city": "Oslo"}', "output": "Sunny", "error": None, "status": "completed"},
             {"type": "mcp_call", "id": "mcp_2", "server_label": "weather", "name": "lookup_weather",
              "arguments": "{}", "output": None, "status": "failed",
              "error": {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "on fire"}]}},
             {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "weather", "name": "lookup_weather",
              "arguments": "{}"},
             {"type": "mcp_approval_request", "id": "mcpr_2", "server_label": "weather", "name": "lookup_weather",
              "arguments": "{}"}]
    answers = [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False},
               {"type": "mcp_approval_response", "approval_request_id": "mcpr_2", "approve": True}]
    chat = to_messages(None, items, answers)
    assert [(m.role, m.content, [c.id for c in m.tool_calls], m.tool_call_id) for m in chat] == [
        ("user", "Weather in Oslo?", [], ""),
        ("assistant", "", ["mcp_1"], ""), ("tool", "Sunny", [], "mcp_1"),
        ("assistant", "", ["mcp_2"], ""), ("tool", "Error: on fire", [], "mcp_2"),
        ("assistant", "", ["mcpr_1"], ""), ("tool", DENIED, [], "mcpr_1")]  # approved: its mcp_call follows


def test_approval_answers_must_name_a_request_of_a_named_server():
    from services.gateway.mcp.tools import parse_mcp_tools

    servers = parse_mcp_tools([{"type": "mcp", "server_label": "weather", "server_url": "http://127.0.0.1:1/mcp"}])
    history = [{"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "weather", "name": "t",
                "arguments": "{}"}]
    check_approvals(history, [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}],
                    servers)
    with pytest.raises(OpenAIError) as e:
        check_approvals(history, [{"type": "message"}, {"type": "mcp_approval_response",
                                                        "approval_request_id": "mcpr_9", "approve": True}], servers)
    assert (e.value.status, e.value.param) == (400, "input[1].approval_request_id")
    with pytest.raises(OpenAIError) as e:
        check_approvals(history, [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1",
                                   "approve": True}], [])
    assert "not in 'tools'" in e.value.message


def test_the_chain_s_listing_is_reused():
    from services.gateway.mcp.tools import parse_mcp_tools

    (spec,) = parse_mcp_tools([{"type": "mcp", "server_label": "weather", "server_url": "http://127.0.0.1:1/mcp"}])
    chain = [{"type": "mcp_list_tools", "server_label": "weather", "tools": TOOLS, "error": None}]
    assert listed_in_chain(chain, spec) == TOOLS
    assert listed_in_chain([{**chain[0], "error": "down"}], spec) is None
    assert listed_in_chain([{**chain[0], "server_label": "other"}], spec) is None


def test_a_failed_call_carries_the_typed_error_the_sdk_reads():
    enc = encoder()
    enc.start()
    enc.encode(call("lookup_weather", "{}"))
    enc.encode(final())
    (pending,) = enc.take_pending()
    error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "on fire"}]}
    events = enc.call_done(pending, None, error)
    assert kinds(events) == ["response.mcp_call.failed", "response.output_item.done"]
    enc.encode(pb.InferEvent(delta=pb.Delta(text="Sorry.")))
    done = enc.encode(final(pb.FINISH_REASON_STOP))
    response = Response.model_validate(done[-1]["response"])
    assert response.output[0].status == "failed" and response.output[0].error.type == "mcp_tool_execution_error"
