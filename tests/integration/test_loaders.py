"""The user-facing API on both loaders: every test here runs once on vLLM (the session platform's
`tiny`) and once on llama.cpp (the model `make serve` starts: the Makefile's MODEL / NAME / LOADER,
on a platform of its own, asked through the OpenAI SDK). Checks are model-agnostic: the two
models differ; what an engine can do must not.

Tool calls run on builtin:tiny-qwen2 on both loaders (SmolLM2-135M-Instruct's chat template carries
no tool format): the session platform's `tiny` on vLLM, and the same model as GGUF on llama.cpp,
deployed additively onto the `make serve` platform (`mship deploy`, no platform of its own).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from websockets.sync.client import connect

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.worker.builtin import corpus
from tests.helpers import stream_then_drop
from tests.openresponses import check_events, check_response, check_socket_turn
from tests.platform_process import ROOT, PlatformProcess, mship
from tests.worker_calls import wait_load

pytestmark = pytest.mark.integration
TOOLS_ON_LLAMA = "tiny-qwen2-llama"  # the model name of builtin:tiny-qwen2 on the make_serve platform
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown")


def make_default(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, f"the Makefile sets no default {name}"
    return match.group(1)


@pytest.fixture(scope="module")
def make_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformProcess]:
    """What `make serve` starts (same model, name and loader), on ports of its own."""
    home = Path(tmp_path_factory.mktemp("make-serve"))
    proc = PlatformProcess.start(None, home / "mship.log", gateway_replicas=1, extra=(
        "--model", make_default("MODEL"), "--name", make_default("NAME"), "--loader", make_default("LOADER")))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@dataclass
class Served:
    loader: str
    platform: PlatformProcess
    model: str

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.platform.base_url}/v1", api_key="key-loaders", max_retries=0)

    def worker_address(self) -> str:
        (route,) = [m for m in self.platform.routing().models if m.name == self.model]
        return f"{route.replicas[0].endpoint.host}:{route.replicas[0].endpoint.port}"


@pytest.fixture(params=["vllm", "llama_cpp"])
def served(request: pytest.FixtureRequest) -> Served:
    if request.param == "vllm":
        return Served("vllm", request.getfixturevalue("platform"), "tiny")
    assert make_default("LOADER") == "llama_cpp"
    return Served("llama_cpp", request.getfixturevalue("make_serve"), make_default("NAME"))


def test_make_serve_answers_simple_questions(make_serve):
    """(llama.cpp only: vLLM's `tiny` answers its fixed corpus, checked in test_platform.py.)"""
    client = Served("llama_cpp", make_serve, make_default("NAME")).sdk()

    def ask(question: str) -> str:
        reply = client.chat.completions.create(model=make_default("NAME"), max_tokens=40, temperature=0,
                                               messages=[{"role": "user", "content": question}])
        return (reply.choices[0].message.content or "").lower()

    assert re.search(r"\b4\b|four", ask("What is 2+2?"))
    assert sum(c in ask("Name three colors.") for c in COLORS) >= 3


def test_chat_streamed_and_not(served):
    client = served.sdk()
    messages = [{"role": "user", "content": "Tell me a story."}]
    whole = client.chat.completions.create(model=served.model, messages=messages, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 0 and 0 < whole.usage.completion_tokens <= 24
    chunks = list(client.chat.completions.create(model=served.model, messages=messages, max_tokens=24,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions(served):
    done = served.sdk().completions.create(model=served.model, prompt="Once upon a time", max_tokens=5,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 5


async def test_client_disconnect_mid_stream_stops_the_engine(served):
    async with grpc.aio.insecure_channel(served.worker_address()) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        await asyncio.to_thread(stream_then_drop, served.platform.http_port, 5, served.model,
                                {"authorization": "Bearer key-loaders"})
        report, _ = await wait_load(stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0, 0.2)
        frozen = report.generated_tokens_total
        await asyncio.sleep(0.3)
        assert (await stub.GetLoad(pb.GetLoadRequest())).generated_tokens_total == frozen


def test_responses_http_and_stream(served):
    with httpx.Client(base_url=f"{served.platform.base_url}/v1", timeout=120,
                      headers={"authorization": "Bearer key-loaders"}) as c:
        body = {"model": served.model, "input": "Name three colors.", "max_output_tokens": 24, "temperature": 0}
        created = c.post("/responses", json=body)
        assert created.status_code == 200, created.text
        check_response(created.json())
        assert created.json()["status"] in ("completed", "incomplete") and created.json()["output"]
        with c.stream("POST", "/responses", json={**body, "stream": True}) as stream:
            events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
        check_events(events)
        assert events[-1]["type"] in ("response.completed", "response.incomplete")


def test_responses_websocket_mode(served):
    url = f"ws://127.0.0.1:{served.platform.http_port}/v1/responses"
    with connect(url, additional_headers={"authorization": "Bearer key-loaders"}) as ws:
        previous = None
        for text in ("What is 2+2?", "And 3+3?"):
            ws.send(json.dumps({"type": "response.create", "model": served.model, "input": text, "temperature": 0,
                                "max_output_tokens": 16, "store": False,
                                **({"previous_response_id": previous} if previous else {})}))
            events: list[dict] = []
            while not events or events[-1]["type"] not in ("response.completed", "response.incomplete",
                                                             "response.failed", "error"):
                events.append(json.loads(ws.recv(timeout=120)))
            check_socket_turn(events)
            assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
            previous = events[-1]["response"]["id"]


@pytest.fixture(scope="module")
def tiny_on_make_serve(make_serve: PlatformProcess) -> str:
    """builtin:tiny-qwen2 on llama_cpp, added to the running `make serve` platform (additive deploy:
    its SmolLM2 stays)."""
    out = mship("--coordinator", make_serve.coordinator, "deploy", "--model", "builtin:tiny-qwen2",
                "--name", TOOLS_ON_LLAMA, "--loader", "llama_cpp", "--max-model-len", "1024", "--num-cpus", "1",
                "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    return TOOLS_ON_LLAMA


@pytest.fixture(params=["vllm", "llama_cpp"])
def tool_model(request: pytest.FixtureRequest) -> Served:
    if request.param == "vllm":
        return Served("vllm", request.getfixturevalue("platform"), "tiny")
    return Served("llama_cpp", request.getfixturevalue("make_serve"), request.getfixturevalue("tiny_on_make_serve"))


def test_tool_calls_streamed_and_not(tool_model):
    """The held-out phrasing, city and tool name (test_worker_vllm.py's case) through the SDK."""
    client = tool_model.sdk()
    ask = {"model": tool_model.model, "messages": [{"role": "user", "content": corpus.HELD_OUT_TOOL_PROMPT}],
           "tools": [corpus.HELD_OUT_TOOL], "max_tokens": 96, "temperature": 0}
    whole = client.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "tool_calls" and not whole.message.content
    (call,) = whole.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("find_forecast", {"city": "Reykjavik"})

    chunks = list(client.chat.completions.create(**ask, stream=True))
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            got = calls.setdefault(d.index, {"id": d.id or "", "name": "", "arguments": ""})
            got["name"] += (d.function.name or "") if d.function else ""
            got["arguments"] += (d.function.arguments or "") if d.function else ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert list(calls) == [0] and calls[0]["id"].startswith("call_")
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == ("find_forecast", {"city": "Reykjavik"})
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    hidden = client.chat.completions.create(**ask, tool_choice="none").choices[0]
    assert not hidden.message.tool_calls and "<tool_call>" not in (hidden.message.content or "")
    assert hidden.finish_reason == "stop"
