"""Tool calls on both loaders, with builtin:tiny-qwen2: on vLLM (the session's worker process) and on
llama_cpp (its F32 GGUF, builtin/tiny_qwen2_gguf.py, in a real `llama-server` behind a worker gRPC
server in this process). Every tool-call case runs on both with the same assertions.

First the equivalence that makes that fair: llama.cpp tokenizes like the HF tokenizer
(tokenizer.json), its Jinja renders the chat template like transformers (tools, tool results), and
its greedy generation is token for token the HF model's (transformers, CPU, float32) on every
behaviour the builder checks plus the wide held-out tool calls.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.worker.builtin import copy_drills, corpus, resolve_model_ref, tiny_qwen2_checks
from services.worker.server import WorkerServer
from tests.llama_worker import engine, running_worker, stub_of
from tests.worker_calls import chat, collect, greedy

pytestmark = pytest.mark.integration
MODEL = "tiny"
STRINGS = [  # NFC text: llama.cpp has no normalizer step (tiny_qwen2_gguf.py)
    "What is the weather in Paris?",
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    "<|im_end|>\n",
    "Zürich, São Paulo, Kraków, 東京, Москва — naïve café ☕ 🙂",
    "12345 + 67.89 = 2024, 3.14159",
    "line one\nline two\n\n\ttabbed\r\n   spaced   \n",
    "it's I'LL they've WE'D <think>\nhmm\n</think>",
]
CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": corpus.HELD_OUT_TOOL_PROMPT}], [corpus.HELD_OUT_TOOL]),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": corpus.TIME_PROMPT}], corpus.TOOLS),
    ([{"role": "user", "content": corpus.TOOL_PROMPT},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
          "name": "get_weather", "arguments": json.dumps(corpus.EXPECTED_TOOL_CALL["arguments"])}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": corpus.TOOL_RESULT}], [corpus.WEATHER_TOOL]),
    ([{"role": "developer", "content": "Answer in English."}, {"role": "user", "content": "What is 2 + 2?"}], None),
]


def spec() -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(name=MODEL, model="builtin:tiny-qwen2", loader=common_pb2.LOADER_LLAMA_CPP,
                                max_model_len=1024, max_num_seqs=2, num_cpus=1)


@pytest.fixture(scope="module")
async def llama_worker() -> AsyncIterator[WorkerServer]:
    async with running_worker(spec()) as server:
        yield server


@pytest.fixture(params=["vllm", "llama_cpp"])
async def stub(request: pytest.FixtureRequest) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    """The worker of either loader; the same model, the same assertions."""
    if request.param == "vllm":
        async with grpc.aio.insecure_channel(request.getfixturevalue("worker").address) as channel:
            yield worker_pb2_grpc.WorkerStub(channel)
    else:
        async with stub_of(request.getfixturevalue("llama_worker")) as s:
            yield s


@pytest.fixture
async def llama(llama_worker: WorkerServer) -> AsyncIterator[httpx.AsyncClient]:
    """The llama_cpp worker's own llama-server, over its HTTP API."""
    async with httpx.AsyncClient(base_url=engine(llama_worker).server_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return Path(resolve_model_ref("builtin:tiny-qwen2"))


@pytest.fixture(scope="module")
def hf_tokenizer(hf_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir)  # what vLLM loads (template included)


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    reply = await client.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


# ---- equivalence with the HF model ------------------------------------------------------------
async def test_llama_cpp_tokenizes_like_the_hf_tokenizer(llama, hf_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    for text in STRINGS:
        got = (await post(llama, "/tokenize", {"content": text, "add_special": True, "parse_special": True}))["tokens"]
        assert got == tok.encode(text).ids, text
        assert (await post(llama, "/detokenize", {"tokens": got}))["content"] == text


async def test_llama_cpp_renders_the_chat_template_like_transformers(llama, hf_tokenizer):
    for messages, tools in CONVERSATIONS:
        body = {"messages": messages, "add_generation_prompt": True, **({"tools": tools} if tools else {})}
        rendered = (await post(llama, "/apply-template", body))["prompt"]
        assert rendered == hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                            add_generation_prompt=True)


async def test_greedy_generation_is_the_hf_models_token_for_token(llama, hf_dir, hf_tokenizer):
    """Every case the builder checks (answers, tool calls, answers from tool results, <think>) and the
    30 wide held-out tool calls and answers from results (some of which the model gets wrong: then
    both engines get it wrong alike)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    required = tiny_qwen2_checks.check_cases()
    wide = [case for case in [*copy_drills.held_out_cases(wide=True), *tiny_qwen2_checks.held_out_result_cases(
        wide=True)] if case not in required]
    for messages, tools, expected in [*required, *wide]:
        prompt = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=96, do_sample=False,
                                 eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
        ref_ids = ref[0, len(ids):].tolist()
        got = await post(llama, "/completion", {"prompt": ids, "n_predict": 96, "temperature": 0,
                                                "return_tokens": True})
        assert got["tokens"] == ref_ids, messages[-1]["content"]  # the EOS included
        assert got["content"] == hf_tokenizer.decode(ref_ids, skip_special_tokens=True)
        if (messages, tools, expected) in required:
            assert got["content"] == expected


# ---- the worker's tool calls, on both loaders -----------------------------------------------
async def test_tool_call_parsed_from_real_generation(stub):
    r = await collect(stub, chat(corpus.TOOL_PROMPT, tools=[corpus.WEATHER_TOOL], sampling=greedy(96)))
    assert r.text == ""
    assert len(r.tool_calls) == 1
    call = r.tool_calls[0]
    assert call.id.startswith("call_")
    assert {"name": call.name, "arguments": json.loads(call.arguments)} == corpus.EXPECTED_TOOL_CALL
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_TOOL_CALLS


async def test_tool_call_generalises_to_held_out_phrasing_city_and_tool_name(stub):
    r = await collect(stub, chat(corpus.HELD_OUT_TOOL_PROMPT, tools=[corpus.HELD_OUT_TOOL], sampling=greedy(96)))
    assert r.text == "" and len(r.tool_calls) == 1
    call = r.tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("find_forecast", {"city": "Reykjavik"})
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_TOOL_CALLS


async def test_tool_choice_none_hides_tools(stub):
    r = await collect(stub, chat(corpus.TOOL_PROMPT, tools=[corpus.WEATHER_TOOL], sampling=greedy(96),
                                 tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)))
    assert r.tool_calls == [] and "<tool_call>" not in r.text
    assert r.text == corpus.NO_TOOL_ANSWER  # the model's answer to the question without tools
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_STOP


@pytest.mark.parametrize("result", [corpus.TOOL_RESULT, corpus.TEXT_RESULT], ids=["json", "text"])
async def test_tool_result_continues_the_conversation(stub, result):
    call = corpus.EXPECTED_TOOL_CALL
    messages = [
        pb.ChatMessage(role="user", content=corpus.TOOL_PROMPT),
        pb.ChatMessage(role="assistant", content="", tool_calls=[
            pb.ToolCall(id="call_1", name=call["name"], arguments=json.dumps(call["arguments"]))]),
        pb.ChatMessage(role="tool", tool_call_id="call_1", content=result)]
    request = chat("", tools=[corpus.WEATHER_TOOL], sampling=greedy(64))
    request.chat.ClearField("messages")
    request.chat.messages.extend(messages)
    r = await collect(stub, request)
    # a JSON result gets the fixed answer; a text one is answered from (copied)
    answer = corpus.TOOL_RESULT_ANSWER if result == corpus.TOOL_RESULT else corpus.tool_text_answer(result)
    assert (r.text, r.tool_calls) == (answer, [])


async def test_a_streamed_tool_call_arrives_whole_in_one_delta(stub):
    """Token by token from the engine, but the parser holds the call back until `</tool_call>`: one
    delta carries it complete, and no delta leaks any of the tags' text."""
    events = [e async for e in stub.Infer(chat(corpus.TIME_PROMPT, tools=corpus.TOOLS, sampling=greedy(96)))]
    deltas, final = [e.delta for e in events[:-1]], events[-1].final
    assert all(e.HasField("delta") for e in events[:-1]) and events[-1].HasField("final")
    with_calls = [d for d in deltas if d.tool_calls]
    assert len(with_calls) == 1 and [d.text for d in deltas] == [""] * len(deltas)
    (call,) = with_calls[0].tool_calls
    assert (call.index, call.name, json.loads(call.arguments)) == (0, "get_time", {"city": "Tokyo"})
    assert call.id.startswith("call_")
    assert final.choices[0].finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert final.usage.completion_tokens > len(deltas)  # the call's tokens were held back, not sent as text
