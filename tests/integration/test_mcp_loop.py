"""The server-side MCP tool loop of `/v1/responses` on the real platform: a real MCP server (the
`mcp` SDK over streamable HTTP, tests/mcp_server.py), the real engines (builtin:tiny-qwen2 on vLLM,
and its GGUF on llama.cpp), the session's gateways with MSHIP_MCP_ALLOWED_HOSTS=127.0.0.1.

The tiny model calls the weather tool the MCP server lists (`get_weather`, the one it was trained
on, for "What is the weather in Paris?"; and `weather_now`, a name it never saw, for Nairobi, a
city it never saw) and, shown the tool's text result, answers from it:
`corpus.tool_text_answer(result)` copies the result. The loop is proven by the call the MCP server
saw, the `mcp_call` carrying its output, and the answer generated from that output."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import openai
import pytest
from openai.types.responses import Response

from services.gateway.responses.protocol_mcp_items import DENIED
from services.worker.builtin import corpus
from tests.integration.conftest import PLATFORM_MODELS
from tests.mcp_server import McpTestServer
from tests.platform_process import PlatformProcess, free_port, mship

pytestmark = pytest.mark.integration
TOOL = corpus.EXPECTED_TOOL_CALL["name"]  # the weather tool and city the model was trained on
CITY = corpus.EXPECTED_TOOL_CALL["arguments"]["city"]
QUESTION = corpus.TOOL_PROMPT
RESULT = f"Sunny, 21 C in {CITY}"  # = corpus.TEXT_RESULT, what get_weather below says
ANSWER = corpus.tool_text_answer(RESULT)  # the model answers from the tool's text result
# Issue #16: a tool name and a city the model never saw -- only copying gets the call and the answer right.
UNSEEN_TOOL = corpus.MCP_HELD_OUT_CALL["name"]
UNSEEN_CITY = corpus.MCP_HELD_OUT_CALL["arguments"]["city"]
LLAMA = "tiny-llama"


def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"Sunny, 21 C in {city}"


def weather_now(city: str) -> str:
    return f"Sunny, 21 C in {city}"


weather_now.__name__, weather_now.__doc__ = UNSEEN_TOOL, corpus.MCP_HELD_OUT_DESCRIPTION


@pytest.fixture(scope="module")
def mcp() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        server.start(tools=[get_weather, weather_now, *server.default_tools()])
        yield server


@pytest.fixture(scope="module")
def refusing_mcp() -> Iterator[McpTestServer]:
    """Up, but answers tools/list with a JSON-RPC error."""
    with McpTestServer(refused_methods={"tools/list"}) as server:
        server.start()
        yield server


@pytest.fixture(scope="module")
def models(platform: PlatformProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`tiny` (vLLM) and the same model's GGUF on llama.cpp beside it (an additive deploy),
    reconciled away afterwards."""
    home = Path(tmp_path_factory.mktemp("mcp"))
    (home / "llama.yaml").write_text(f"models:\n  - name: {LLAMA}\n    model: builtin:tiny-qwen2\n"
                                     "    loader: llama_cpp\n    n_ctx: 1024\n    num_cpus: 0.5\n")
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "llama.yaml"), "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    yield {"vllm": "tiny", "llama_cpp": LLAMA}
    (home / "session.yaml").write_text(PLATFORM_MODELS)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "session.yaml"),
                "--reconcile", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr


def mcp_tool(url: str, tool: str = TOOL, **extra) -> dict:
    return {"type": "mcp", "server_label": "weather", "server_url": url, "allowed_tools": [tool],
            "require_approval": "never", "headers": {"x-test-secret": "s3cret-header"}, **extra}


def http(platform: PlatformProcess) -> httpx.Client:
    return httpx.Client(base_url=f"{platform.base_url}/v1", headers={"authorization": f"Bearer {platform.api_key}"},
                        timeout=180)


def create(platform: PlatformProcess, model: str, tools: list[dict], **body) -> dict:
    with http(platform) as c:
        r = c.post("/responses", json={"model": model, "input": QUESTION, "tools": tools, "temperature": 0,
                                       "max_output_tokens": 64, **body})
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())  # the official SDK's own types
    return r.json()


def text_of(response: dict) -> str:
    return "".join(p["text"] for i in response["output"] if i["type"] == "message" for p in i["content"])


def calls_since(server: McpTestServer, t0: float) -> list:
    return [c for c in server.calls if c.time >= t0]


@pytest.mark.parametrize("loader", ["vllm", "llama_cpp"])
def test_list_call_answer_streamed_items_and_events_in_order(platform, models, mcp, loader):
    t0 = time.monotonic()
    with http(platform) as c, c.stream("POST", "/responses", json={
            "model": models[loader], "input": QUESTION, "tools": [mcp_tool(mcp.url)], "temperature": 0,
            "max_output_tokens": 64, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    kinds = [e["type"] for e in events]
    final = events[-1]["response"]
    assert kinds[-1] == "response.completed", kinds
    assert [i["type"] for i in final["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    listing, call, _ = final["output"]
    assert [t["name"] for t in listing["tools"]] == [TOOL]  # allowed_tools filters the listing
    assert (call["name"], json.loads(call["arguments"]), call["output"], call["error"], call["status"]) == \
        (TOOL, {"city": CITY}, RESULT, None, "completed")
    assert text_of(final) == ANSWER  # the model answered from the tool's output
    assert [(c.tool, c.arguments) for c in calls_since(mcp, t0)] == [(TOOL, {"city": CITY})]
    # the events, in the order the Responses API gives them
    mcp_kinds = [k for k in kinds if ".mcp_" in k or k.startswith("response.output_item")]
    assert mcp_kinds[:4] == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                             "response.mcp_list_tools.completed", "response.output_item.done"]
    call_events = [k for k in mcp_kinds[4:] if "mcp_call" in k]
    assert call_events[0] == "response.mcp_call.in_progress" and call_events[-2:] == [
        "response.mcp_call_arguments.done", "response.mcp_call.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert final["usage"]["output_tokens"] > 0
    assert all(t.get("headers") is None for t in final["tools"])  # header values are never echoed or stored
    assert "s3cret-header" not in json.dumps(events)
    assert any(req.headers.get("x-test-secret") == "s3cret-header" for req in mcp.requests)


@pytest.mark.parametrize("loader", ["vllm", "llama_cpp"])
def test_an_unseen_tool_name_and_city_are_copied_and_answered_from(platform, models, mcp, loader):
    t0 = time.monotonic()
    response = create(platform, models[loader], [mcp_tool(mcp.url, UNSEEN_TOOL)], input=corpus.MCP_HELD_OUT_PROMPT)
    assert [i["type"] for i in response["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    listing, call, _ = response["output"]
    assert [t["name"] for t in listing["tools"]] == [UNSEEN_TOOL]
    assert (call["name"], json.loads(call["arguments"]), call["output"], call["status"]) == \
        (UNSEEN_TOOL, {"city": UNSEEN_CITY}, corpus.MCP_HELD_OUT_RESULT, "completed")
    assert text_of(response) == corpus.tool_text_answer(corpus.MCP_HELD_OUT_RESULT)
    assert [(c.tool, c.arguments) for c in calls_since(mcp, t0)] == [(UNSEEN_TOOL, {"city": UNSEEN_CITY})]


def test_the_sdk_sees_the_mcp_items_and_the_chain_reuses_the_listing(platform, models, mcp):
    client = openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=platform.api_key, max_retries=0)
    first = client.responses.create(model="tiny", input=QUESTION, tools=[mcp_tool(mcp.url)], temperature=0,
                                    max_output_tokens=64)
    assert [i.type for i in first.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert first.output_text == ANSWER
    t0 = time.monotonic()
    second = client.responses.create(model="tiny", input=QUESTION, tools=[mcp_tool(mcp.url)], temperature=0,
                                     max_output_tokens=64, previous_response_id=first.id)
    assert [i.type for i in second.output] == ["mcp_call", "message"]  # listed tools cached per chain
    assert len(calls_since(mcp, t0)) == 1


def test_approval_round_trip_approve_and_deny(platform, models, mcp):
    t0 = time.monotonic()
    asked = create(platform, "tiny", [mcp_tool(mcp.url, require_approval="always")])
    assert [i["type"] for i in asked["output"]] == ["mcp_list_tools", "mcp_approval_request"]
    request = asked["output"][1]
    assert (request["name"], json.loads(request["arguments"])) == (TOOL, {"city": CITY})
    assert asked["status"] == "completed" and calls_since(mcp, t0) == []  # nothing runs before approval

    approved = create(platform, "tiny", [mcp_tool(mcp.url, require_approval="always")],
                      previous_response_id=asked["id"], input=[
                          {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}])
    assert [i["type"] for i in approved["output"]] == ["mcp_call", "message"]
    assert approved["output"][0]["approval_request_id"] == request["id"]
    assert approved["output"][0]["output"] == RESULT and text_of(approved) == ANSWER
    assert len(calls_since(mcp, t0)) == 1

    t1 = time.monotonic()
    denied = create(platform, "tiny", [mcp_tool(mcp.url, require_approval="always")],
                    previous_response_id=asked["id"], input=[
                        {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False}])
    assert [i["type"] for i in denied["output"]] == ["message"]
    assert DENIED == corpus.DENIED_RESULT  # what the build checks the model answers from
    assert text_of(denied) == corpus.tool_text_answer(DENIED)  # the model was shown a result: the denial
    assert calls_since(mcp, t1) == []

    with http(platform) as c:  # an approval for a request that does not exist is a 400 naming it
        r = c.post("/responses", json={"model": "tiny", "tools": [mcp_tool(mcp.url)], "previous_response_id":
                                       asked["id"], "input": [{"type": "mcp_approval_response",
                                                               "approval_request_id": "mcpr_nope", "approve": True}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].approval_request_id", r.text


def test_background_cancel_mid_loop_stays_cancelled_and_no_call_follows(platform, models):
    release = threading.Event()

    async def slow_get_weather(city: str) -> str:
        """Get the current weather for a city."""
        while not release.is_set():  # noqa: ASYNC110 -- a threading.Event, set from the test thread
            await anyio.sleep(0.05)
        return f"Rain in {city}"
    slow_get_weather.__name__ = TOOL

    with McpTestServer() as server:
        server.start(tools=[slow_get_weather])
        started = create(platform, "tiny", [mcp_tool(server.url)], background=True)
        assert started["status"] in ("queued", "in_progress")
        deadline = time.monotonic() + 120
        while not server.calls and time.monotonic() < deadline:  # the loop reached the tool call
            time.sleep(0.1)
        assert len(server.calls) == 1, "the loop never called the tool"
        with http(platform) as c:
            cancelled = c.post(f"/responses/{started['id']}/cancel").json()
            assert cancelled["status"] == "cancelled"
            release.set()  # the tool would answer now: nothing may come of it
            # a window to see a call that must not happen (absence has no event to wait on)
            time.sleep(3)
            after = c.get(f"/responses/{started['id']}").json()
        assert after["status"] == "cancelled"
        assert len(server.calls) == 1


def test_unreachable_server_and_refused_hosts_fail_the_response_clearly(platform, models, refusing_mcp):
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    for url, words in ((dead, ("weather", "unreachable")),
                       (refusing_mcp.url, ("weather", "refused to list tools")),
                       ("http://127.0.0.2:9/mcp", ("MSHIP_MCP_ALLOWED_HOSTS",)),
                       ("http://169.254.169.254/mcp", ("169.254.169.254",))):
        failed = create(platform, "tiny", [mcp_tool(url)])  # a 200 with a failed response, never a 5xx
        assert failed["status"] == "failed", failed
        assert [i["type"] for i in failed["output"]] == ["mcp_list_tools"] and failed["output"][0]["error"]
        message = failed["error"]["message"]
        assert all(w in message for w in words), message
    with http(platform) as c, c.stream("POST", "/responses", json={
            "model": "tiny", "input": QUESTION, "tools": [mcp_tool(dead)], "stream": True}) as r:
        assert r.status_code == 200
        kinds = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: {")]
    assert kinds[-1] == "response.failed" and "response.mcp_list_tools.failed" in kinds


def test_bad_mcp_tools_are_400s_naming_the_field(platform, mcp):
    cases = [({"type": "mcp", "server_url": mcp.url}, "tools[0].server_label"),
             ({"type": "mcp", "server_label": "w", "server_url": "ftp://x/mcp"}, "tools[0].server_url"),
             ([mcp_tool(mcp.url), mcp_tool(mcp.url)], "tools[1].server_label")]
    with http(platform) as c:
        for tools, param in cases:
            r = c.post("/responses", json={"model": "tiny", "input": "hi",
                                           "tools": tools if isinstance(tools, list) else [tools]})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_generation_the_model_refuses_is_its_own_error_not_a_500(platform, mcp):
    """The loop opens its generations itself (after listing): a prompt over the model's context is
    the same 400 as without MCP tools (it was a 500)."""
    long_input = "weather " * 3000  # well past tiny's max_model_len of 1024
    with http(platform) as c:
        for tools in ([mcp_tool(mcp.url)], []):
            r = c.post("/responses", json={"model": "tiny", "input": long_input, "tools": tools})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_a_failing_tool_is_an_mcp_call_with_its_error_and_the_model_is_told(platform, models):
    def get_weather_broken(city: str) -> str:
        """Get the current weather for a city."""
        raise RuntimeError("the weather station is on fire")
    get_weather_broken.__name__ = TOOL
    with McpTestServer() as server:
        server.start(tools=[get_weather_broken])
        response = create(platform, "tiny", [mcp_tool(server.url)])
    call = response["output"][1]
    assert call["type"] == "mcp_call" and call["status"] == "failed"
    # what the server said (the SDK's server hides the exception's own text behind its message)
    assert call["error"]["type"] == "mcp_tool_execution_error"
    assert "Error executing tool get_weather" in call["error"]["content"][0]["text"]
    # The model was told: it answers from the error text. (The tiny model copies a text result, but
    # this one names the tool it just called, and its copy can jump into that call and run on to
    # max_output_tokens: then the response is `incomplete`, which is what the API says of it.)
    assert response["status"] in ("completed", "incomplete") and response["output"][2]["type"] == "message"
    assert text_of(response).startswith("Error")
