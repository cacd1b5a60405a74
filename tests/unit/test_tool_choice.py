"""tool_choice "required" / a named function, enforced (services/worker/tool_choice.py): the
schemas the engine is constrained with (vLLM's own), the refusal of a response_format beside
them, their reaching vLLM's and llama.cpp's structured output, and the parsers that read the
constrained output as tool calls. The servicer around them: tests/unit/test_worker_servicer.py."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import ServiceError
from services.worker.engine import Prompt, RenderRequest
from services.worker.llama_cpp_engine import LlamaCppEngine
from services.worker.llama_server import ServerConfig
from services.worker.parsers import opens_reasoning
from services.worker.sampling import Sampling
from services.worker.tool_choice import NamedCallParser, RequiredCallsParser, forced_call, required_schema

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {
    "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}}, "required": ["city"],
    "$defs": {"City": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "", "parameters": {}}}
REQUIRED = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)
NAMED = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name="get_weather")


def feed(parser, text: str, chunk: int):
    outs = [parser.feed(text[i:i + chunk]) for i in range(0, len(text), chunk)] + [parser.finish()]
    assert all(not o.text and not o.reasoning for o in outs)  # never text
    return [c for o in outs for c in o.tool_calls]


@pytest.mark.parametrize("parallel", [True, False])
def test_the_required_schema_is_vllms(parallel):
    """The same schema vLLM's own server constrains "required" with (its `$defs` lifted)."""
    utils = pytest.importorskip("vllm.tool_parsers.utils")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    tools = [WEATHER, TIME]
    theirs = utils.get_json_schema_from_tools(
        "required", [ChatCompletionToolsParam(**copy.deepcopy(t)) for t in tools], parallel_tool_calls=parallel)
    assert required_schema(tools, parallel=parallel) == theirs
    assert "$defs" in WEATHER["function"]["parameters"]  # the tool the chat template gets is left as it was


def test_the_forced_call_of_each_mode():
    tools = [copy.deepcopy(WEATHER)]
    named = forced_call(pb.InferRequest(tool_choice=NAMED), tools)
    assert named is not None and (named.name, named.schema) == ("get_weather", WEATHER["function"]["parameters"])
    empty = forced_call(pb.InferRequest(tool_choice=pb.ToolChoice(
        mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name="get_time")), [TIME])
    assert empty is not None and empty.schema == {"type": "object", "properties": {}}  # still a JSON object
    required = forced_call(pb.InferRequest(tool_choice=REQUIRED, parallel_tool_calls=True), tools)
    assert required is not None and required.name is None and required.schema["type"] == "array"
    for mode in (pb.TOOL_CHOICE_MODE_UNSPECIFIED, pb.TOOL_CHOICE_MODE_AUTO, pb.TOOL_CHOICE_MODE_NONE):
        assert forced_call(pb.InferRequest(tool_choice=pb.ToolChoice(mode=mode)), tools) is None
    assert forced_call(pb.InferRequest(tool_choice=REQUIRED), None) is None  # a raw prompt renders no tools


@pytest.mark.parametrize("fmt", [dict(json_schema={"type": "object"}), dict(json_object=True), dict(regex="a+"),
                                 dict(choice=("a", "b"))])
def test_a_response_format_beside_a_forced_call_is_refused_naming_tool_choice(fmt):
    forced = forced_call(pb.InferRequest(tool_choice=REQUIRED), [WEATHER])
    assert forced is not None
    with pytest.raises(ServiceError) as refused:
        forced.constrain(Sampling(**fmt))
    assert refused.value.field_violations[0][0] == "tool_choice" and "response_format" in str(refused.value)
    assert forced.constrain(Sampling(max_tokens=9)) == Sampling(max_tokens=9, json_schema=forced.schema)


def test_llama_cpp_constrains_a_forced_call_with_its_json_schema():
    forced = forced_call(pb.InferRequest(tool_choice=REQUIRED), [WEATHER, TIME])
    assert forced is not None
    sampling = forced.constrain(Sampling())
    LlamaCppEngine._check(sampling)  # not refused
    engine = LlamaCppEngine.__new__(LlamaCppEngine)
    engine.max_model_len = 100
    assert engine._body(Prompt([1], "id"), sampling, slot=0, reuse=False)["json_schema"] == forced.schema


def test_vllm_constrains_a_forced_call_with_its_structured_output():
    pytest.importorskip("vllm")
    from services.worker.vllm_engine import VllmEngine

    forced = forced_call(pb.InferRequest(tool_choice=NAMED), [WEATHER])
    assert forced is not None
    engine = VllmEngine.__new__(VllmEngine)
    engine.max_model_len = 100
    params = engine._sampling_params(forced.constrain(Sampling()), prompt_len=3)
    assert params.structured_outputs.json == WEATHER["function"]["parameters"]


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_a_named_call_streams_its_arguments(chunk):
    calls = feed(NamedCallParser("get_weather"), '\n {"city": "Paris"}', chunk)
    assert (calls[0].name, calls[0].index) == ("get_weather", 0) and calls[0].id.startswith("call_")
    assert all((c.index, c.id, c.name) == (0, "", "") for c in calls[1:])
    assert json.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}


def test_a_named_call_cut_short_is_still_announced():
    calls = feed(NamedCallParser("f"), "", 1)
    assert [(c.name, c.arguments) for c in calls] == [("f", "")]


@pytest.mark.parametrize("chunk", [1, 2, 5, 13, 1000])
def test_required_calls_at_any_chunking(chunk):
    out = ('[ {"name": "get_weather", "parameters": {"city": "a \\"}] [{"}}, {"name": "get_time", '
           '"parameters": {"at": [1, {"x": []}]}} ]')
    calls = feed(RequiredCallsParser(), out, chunk)
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
        (0, "get_weather", {"city": 'a "}] [{'}), (1, "get_time", {"at": [1, {"x": []}]})]
    assert len({c.id for c in calls}) == 2


def test_a_required_call_cut_short_is_not_a_call_nor_text():
    """max_tokens ended the array mid-call: the complete calls go out, the cut one is dropped (the
    finish reason, "length", says why), and no JSON reaches the content."""
    calls = feed(RequiredCallsParser(), '[{"name": "f", "parameters": {}}, {"name": "g", "param', 4)
    assert [(c.name, c.arguments) for c in calls] == [("f", "{}")]


async def test_llama_cpp_keeps_the_end_of_the_prompt_it_rendered():
    """Read once per request: a template that opened `<think>` starts the output as reasoning."""
    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/apply-template":
            return httpx.Response(200, json={"prompt": "<|im_start|>assistant\n<think>\n"})
        return httpx.Response(200, json={"tokens": [1, 2, 3]})

    client = httpx.AsyncClient(transport=httpx.MockTransport(server), base_url="http://llama")
    engine = LlamaCppEngine(server=None, client=client, cfg=ServerConfig(model_path="x", n_ctx=64, n_parallel=1))  # type: ignore[arg-type]
    prompt = await engine.render(RenderRequest(messages=[{"role": "user", "content": "hi"}]))
    assert prompt.token_ids == [1, 2, 3] and prompt.engine_input == "" and opens_reasoning(prompt.tail)
    await client.aclose()


def test_vllm_keeps_the_end_of_the_prompt_it_rendered():
    from services.worker.vllm_engine import VllmEngine

    class Tokenizer:
        def decode(self, ids):
            return "<|im_start|>assistant\n<think>\n" if ids == [7, 8] else "?"

    class Renderer:
        def get_tokenizer(self):
            return Tokenizer()

    engine = VllmEngine.__new__(VllmEngine)
    engine._engine = type("Async", (), {"renderer": Renderer()})()
    assert engine._tail({"prompt": "x" * 100 + "assistant\n<think>\n"}, [1]).endswith("<think>\n")
    assert engine._tail({"prompt_token_ids": [7, 8]}, [7, 8]) == "<|im_start|>assistant\n<think>\n"  # no text kept
    assert opens_reasoning(engine._tail({}, [7, 8]))


def test_the_required_schema_as_a_grammar_admits_calls_and_no_text():
    """What the engine's structured output makes of it (xgrammar: vLLM's default backend)."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    one = xgr.Grammar.from_json_schema(json.dumps(required_schema([WEATHER, TIME], parallel=False)))
    many = xgr.Grammar.from_json_schema(json.dumps(required_schema([WEATHER, TIME], parallel=True)))
    call, other = '{"name": "get_weather", "parameters": {"city": "Paris"}}', '{"name": "get_time", "parameters": {}}'
    assert _is_grammar_accept_string(one, f"[{call}]") and _is_grammar_accept_string(many, f"[{call}, {other}]")
    assert not _is_grammar_accept_string(one, f"[{call}, {other}]")  # parallel_tool_calls false: one call
    for bad in ("The weather is nice.", "[]", '[{"name": "nope", "parameters": {}}]'):
        assert not _is_grammar_accept_string(many, bad)
