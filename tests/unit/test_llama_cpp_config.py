"""The llama_cpp loader's decisions without a server: slot choice (per-identity cache reuse), the
llama-server command line from a ModelSpec (slots, context, threads, GPU layers for a GPU share),
GGUF references, the /completion body from sampling, and the models.yaml keys."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from clients.modelset import ConfigError, parse_model
from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import ServiceError
from services.worker import llama_cpp_engine
from services.worker.engine import Prompt
from services.worker.gguf_models import resolve_gguf
from services.worker.llama_cpp_engine import LlamaCppEngine, SlotPool, server_config
from services.worker.llama_server import ServerConfig, gpu_layers
from services.worker.sampling import Sampling, sampling_from_request
from services.worker.vllm_engine import gpu_memory_share
from tests.helpers import until


async def test_a_slot_cache_is_reused_only_by_the_identity_that_filled_it():
    pool = SlotPool(2)
    a, reuse = await pool.acquire("alice")
    assert reuse is False  # a fresh slot: nothing of hers cached yet
    await pool.release(a)
    assert await pool.acquire("alice") == (a, True)
    b, reuse = await pool.acquire("bob")
    assert b != a and reuse is False
    await pool.release(a)
    await pool.release(b)
    # Both slots free: bob gets his own; carol takes a slot another identity filled, without its cache.
    assert await pool.acquire("bob") == (b, True)
    assert await pool.acquire("carol") == (a, False)


async def test_a_request_waits_for_a_free_slot():
    pool = SlotPool(1)
    slot, _ = await pool.acquire("a")
    waiter = asyncio.ensure_future(pool.acquire("b"))
    await asyncio.sleep(0)
    assert not waiter.done() and pool.waiting == 1 and pool.running == 1
    await pool.release(slot)
    assert await asyncio.wait_for(waiter, 1) == (slot, False)


def spec(**kw) -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(name="m", model="x.gguf", loader=common_pb2.LOADER_LLAMA_CPP, **kw)


def test_the_server_config_from_a_spec(monkeypatch):
    cfg = server_config(spec(max_model_len=2048, max_num_seqs=3, num_cpus=2), "/m.gguf", "")
    assert (cfg.n_ctx, cfg.n_parallel, cfg.n_threads, cfg.n_gpu_layers) == (2048, 3, 2, 0)
    explicit = spec(max_model_len=2048, num_cpus=0.5,
                    llama_cpp=common_pb2.LlamaCppOptions(n_ctx=512, n_parallel=8, n_threads=4, n_gpu_layers=7,
                                                         chat_template="T", server_args=["--flash-attn", "on"]))
    cfg = server_config(explicit, "/m.gguf", "builtin template")
    assert (cfg.n_ctx, cfg.n_parallel, cfg.n_threads, cfg.n_gpu_layers, cfg.chat_template) == (512, 8, 4, 7, "T")
    argv = cfg.argv("llama-server", 9999, "/t.jinja")
    assert argv[argv.index("-c") + 1] == str(512 * 8) and argv[argv.index("-np") + 1] == "8"  # -c: all slots
    assert argv[argv.index("--cache-ram") + 1] == "0" and "--no-cache-idle-slots" in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[-2:] == ["--flash-attn", "on"]
    assert "--embeddings" not in argv and argv[argv.index("--chat-template-file") + 1] == "/t.jinja"
    monkeypatch.setattr(llama_cpp_engine, "_gguf_field", lambda path, key: None)  # a GGUF naming no pooling
    embed = server_config(spec(usecase=common_pb2.USECASE_EMBED, num_cpus=0.5), "/m.gguf", "")
    assert embed.embeddings and embed.n_threads == 1 and embed.n_ctx == 4096 and embed.n_parallel == 4
    argv = embed.argv("llama-server", 1, None)
    assert argv[argv.index("--embeddings") + 1:argv.index("--embeddings") + 3] == ["--pooling", "mean"]


@pytest.mark.parametrize("num_gpus, layers", [(0, 0), (0.25, 7), (0.5, 15), (1, 31), (2, 31)])
def test_a_gpu_share_sizes_the_offloaded_layers(monkeypatch, num_gpus, layers):
    assert gpu_layers(num_gpus, 30) == layers
    monkeypatch.setattr(llama_cpp_engine, "_gguf_field", lambda path, key: 30)
    assert server_config(spec(num_gpus=num_gpus), "/m.gguf", "").n_gpu_layers == layers


def test_gguf_references(tmp_path):
    path, template = resolve_gguf("builtin:smollm2-135m-instruct")
    assert path.suffix == ".gguf" and path.is_file() and template == ""  # its template is in the file
    with pytest.raises(ValueError, match="no GGUF"):
        resolve_gguf("builtin:all-minilm-l6-v2")
    with pytest.raises(ValueError, match=r"not a \.gguf"):
        resolve_gguf(str(tmp_path / "model.safetensors"))
    with pytest.raises(FileNotFoundError):
        resolve_gguf(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match=r"hf:ORG/REPO/FILE\.gguf"):
        resolve_gguf("hf:org/file.gguf")


def test_the_completion_body_from_sampling():
    engine = LlamaCppEngine.__new__(LlamaCppEngine)
    engine.max_model_len = 100
    s = Sampling(max_tokens=None, temperature=0.0, repetition_penalty=1.1, logprobs=0, stop=("END",),
                 json_schema={"type": "object"})
    body = engine._body(Prompt([1, 2, 3], "alice"), s, slot=2, reuse=True)
    assert body["n_predict"] == 97 and body["repeat_penalty"] == 1.1 and body["temperature"] == 0.0
    assert (body["id_slot"], body["cache_prompt"], body["prompt"]) == (2, True, [1, 2, 3])
    assert body["n_probs"] == 1 and body["stop"] == ["END"] and body["json_schema"] == {"type": "object"}
    assert "top_p" not in body  # unset: llama.cpp's default
    for bad, param in ((Sampling(n=2), "n"), (Sampling(regex="a+"), "response_format"),
                       (Sampling(min_tokens=3), "min_tokens")):
        with pytest.raises(ServiceError) as refused:
            LlamaCppEngine._check(bad)
        assert refused.value.field_violations[0][0] == param


def llama_body(s: Sampling) -> dict:
    engine = LlamaCppEngine.__new__(LlamaCppEngine)
    engine.max_model_len = 100
    return engine._body(Prompt([1, 2, 3], "alice"), s, slot=0, reuse=False)


def test_top_k_zero_reaches_llama_cpp_as_off():
    """top_k 0 (vLLM: no top-k cut) must not fall back to llama-server's default top_k 40."""
    body = llama_body(sampling_from_request(pb.InferRequest(sampling=pb.SamplingParams(top_k=0))))
    assert body["top_k"] <= 0  # llama.cpp: <= 0 is off


@pytest.mark.parametrize("seed, sent", [(7, 7), (0, 0), (0xFFFFFFFF, 0), (-2, 0xFFFFFFFD), (2**40 + 3, 259),
                                        (-1, 0xFFFFFFFF)])
def test_a_seed_stays_reproducible_on_llama_cpp(seed, sent):
    """llama.cpp's seed is a uint32 whose 0xFFFFFFFF (what -1 wraps to) means "draw a random seed": a
    client's seed (but -1, random as in vLLM) must never land there, and must be a uint32."""
    assert llama_body(Sampling(seed=seed))["seed"] == sent


@pytest.mark.parametrize("sampling, param", [
    (Sampling(stop_token_ids=(2,)), "stop_token_ids"),
    (Sampling(stop=("END",), include_stop_str_in_output=True), "include_stop_str_in_output"),
    (Sampling(skip_special_tokens=False), "skip_special_tokens")])
def test_vllm_extras_llama_cpp_cannot_honour_are_refused(sampling, param):
    """vLLM honours these; llama-server has no per-request form of them, so they are refused by name
    rather than silently dropped."""
    with pytest.raises(ServiceError) as refused:
        LlamaCppEngine._check(sampling)
    assert refused.value.field_violations[0][0] == param
    LlamaCppEngine._check(Sampling(include_stop_str_in_output=True))  # no stop string: nothing to include


def test_models_yaml_llama_cpp_keys():
    entry = {"name": "smol", "model": "builtin:smollm2-135m-instruct", "loader": "llama_cpp", "n_ctx": 1024,
             "n_parallel": 2, "n_gpu_layers": 12, "llama_server_args": ["--flash-attn", "on"],
             "llama_server_binary": "/opt/llama/bin/llama-server"}
    o = parse_model(entry, "models.yaml", "models[0]").llama_cpp
    assert (o.n_ctx, o.n_parallel, o.n_gpu_layers, list(o.server_args), o.server_binary) == (
        1024, 2, 12, ["--flash-attn", "on"], "/opt/llama/bin/llama-server")
    assert parse_model({**entry, "n_gpu_layers": 0}, "f", "m").llama_cpp.HasField("n_gpu_layers")  # 0 = set: none
    assert not parse_model({"name": "s", "model": "a.gguf", "loader": "llama_cpp"}, "f", "m").llama_cpp.HasField(
        "n_gpu_layers")  # unset: sized from num_gpus
    assert parse_model({**entry, "embeddings": True}, "f", "m").usecase == common_pb2.USECASE_EMBED
    for bad, key in (({**entry, "model": "org/model"}, "models[0].model"),
                     ({**entry, "embeddings": True, "usecase": "generate"}, "models[0].embeddings"),
                     ({**entry, "embeddings": "yes"}, "models[0].embeddings"),
                     ({**entry, "llama_server_args": "--x"}, "models[0].llama_server_args"),
                     ({"name": "v", "model": "org/m", "n_ctx": 5}, "models[0].n_ctx")):
        with pytest.raises(ConfigError) as e:
            parse_model(bad, "models.yaml", "models[0]")
        assert e.value.key == key


@pytest.mark.parametrize("num_gpus, share", [(0, None), (0.25, 0.225), (0.5, 0.45), (1, None), (2, None)])
def test_a_gpu_share_sizes_vllm_memory_too(num_gpus, share):
    """The same share on the vLLM loader: gpu_memory_utilization (the code path GPU nodes take)."""
    assert gpu_memory_share(num_gpus) == share


def test_server_config_is_a_plain_record():
    assert ServerConfig("/m.gguf", 16, 1).argv("b", 1, None)[:3] == ["b", "-m", "/m.gguf"]


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


def token(text: str, tid: int, **extra) -> dict:
    return {"content": text, "tokens": [tid], "stop": False,
            "completion_probabilities": [{"token": text, "logprob": -0.5, "top_logprobs": []}], **extra}


async def test_tokens_that_arrive_together_go_on_as_one_step():
    """llama-server's events, grouped by the reads that deliver them (a consumer that lags finds
    several at once): one step per read, nothing held back, a line split across reads intact."""
    end = {"content": "", "tokens": [], "stop": True, "stop_type": "limit", "timings": {"cache_n": 2}}
    lagged = sse(token(" b", 2), token(" c", 3), token(" d", 4))
    reads = [sse(token("a", 1)), lagged[:-20], lagged[-20:], sse(token(" e", 5), end)]

    async def body():
        for data in reads:
            yield data

    engine = LlamaCppEngine.__new__(LlamaCppEngine)
    engine._stats = llama_cpp_engine.EngineStats()
    prompt = Prompt(engine_input=[7, 8, 9], token_ids=[7, 8, 9])
    steps = [s async for s in engine._steps(httpx.Response(200, content=body()), prompt, logprobs=0)]
    got = [(s.choices[0].text, s.choices[0].num_tokens, len(s.choices[0].logprobs), s.finished) for s in steps]
    assert got == [("a", 1, 1, False), (" b c", 2, 2, False), (" d", 1, 1, False), (" e", 1, 1, True)]
    assert steps[-1].choices[0].finish_reason == "length" and steps[-1].cached_tokens == 2
    assert engine._stats.generated_tokens_total == 5


def engine_with(handler) -> LlamaCppEngine:
    """An engine of one slot whose llama-server is `handler` (an httpx MockTransport handler)."""
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://llama")
    return LlamaCppEngine(server=None, client=client, cfg=ServerConfig(model_path="x", n_ctx=64, n_parallel=1))  # type: ignore[arg-type]


async def test_an_abort_reaches_a_request_still_waiting_for_its_slot():
    """Cancel by id, or a request made again, aborts a request that waits for a slot (the gate lets
    in more requests than llama-server has slots): it ends at once, aborted, and never reaches the
    server; the next waiter still gets the slot."""
    posted: list[int] = []

    def server(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content)["id_slot"])
        return httpx.Response(200, content=sse({"content": "x", "tokens": [1], "stop": True, "stop_type": "eos"}))

    engine = engine_with(server)
    slot, _ = await engine.slots.acquire("busy")
    prompt = Prompt(engine_input=[1, 2], token_ids=[1, 2])
    first, second = engine.generate(prompt, Sampling(), "r1"), engine.generate(prompt, Sampling(), "r2")
    waiting, after = asyncio.ensure_future(anext(first)), asyncio.ensure_future(anext(second))
    await until(lambda: engine.slots.waiting == 2, "both waiting for the slot")
    await engine.abort(["r1"])
    step = await asyncio.wait_for(waiting, 5)
    assert (step.choices[0].finish_reason, step.finished) == ("abort", True) and posted == []
    await engine.slots.release(slot)
    assert (await asyncio.wait_for(after, 5)).choices[0].finish_reason == "stop"
    assert posted == [slot]
    await first.aclose()
    await second.aclose()


async def test_an_abort_reaches_a_request_whose_stream_is_opening():
    opened = asyncio.Event()
    answer = asyncio.Event()

    async def server(request: httpx.Request) -> httpx.Response:
        opened.set()
        await answer.wait()
        return httpx.Response(200, content=sse(token("x", 1)))

    engine = engine_with(server)
    steps = engine.generate(Prompt([1], [1]), Sampling(), "r1")
    generating = asyncio.ensure_future(anext(steps))
    await asyncio.wait_for(opened.wait(), 5)
    await engine.abort(["r1"])
    answer.set()
    step = await asyncio.wait_for(generating, 5)
    assert step.choices[0].finish_reason == "abort"  # not the token llama-server began to send
    assert engine.slots.running == 0
    await steps.aclose()


async def test_a_generation_closed_early_closes_its_stream_before_its_slot_is_free():
    """Another request may take the slot at once: llama-server must not still be serving this one
    on it (a consumer leaves early: its client went, or it read the last step)."""
    async def tokens():
        yield sse(token("a", 1))
        await asyncio.Event().wait()  # llama-server would go on generating

    engine = engine_with(lambda request: httpx.Response(200, content=tokens()))
    steps = engine.generate(Prompt([1], [1]), Sampling(), "r1")
    assert (await anext(steps)).choices[0].text == "a"
    reply = engine._streams["r1"]
    release, closed_at_release = engine.slots.release, []

    async def released(slot: int) -> None:
        closed_at_release.append(reply.is_closed)
        await release(slot)

    engine.slots.release = released  # type: ignore[method-assign]
    await steps.aclose()
    assert closed_at_release == [True] and engine.slots.running == 0
