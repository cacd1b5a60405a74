"""The llama_cpp loader: the Engine interface over llama.cpp's own server (`llama_server.py`).

render = the server's chat template (`/apply-template`, Jinja, tools passed through) + `/tokenize`;
generate = a streamed `/completion` of the token ids in a slot this engine chose (`SlotPool`);
closing that stream (a cancelled call, `abort`) stops the slot's generation while the other slots
go on. One choice per request (`n` > 1 is refused): a slot generates one sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx

from mship.common.v1 import common_pb2
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.worker.engine import (
    ChoiceDelta,
    Engine,
    EngineStats,
    Prompt,
    RenderRequest,
    StepOutput,
    TokenLogprob,
    TopToken,
    tail_of,
)
from services.worker.llama_inprocess import runtime_class
from services.worker.llama_server import LlamaServer, ServerConfig, gpu_layers
from services.worker.sampling import Sampling

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per llama-server call
DEFAULT_N_CTX, DEFAULT_N_PARALLEL = 4096, 4
FINISH = {"eos": "stop", "word": "stop", "limit": "length"}
# Sampling -> /completion fields (same meaning, llama.cpp's names)
FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
          "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
          "repetition_penalty": "repeat_penalty", "seed": "seed"}
PROBE_TIMEOUT_S = 5.0  # within Serve's health-check timeout (10 s), which the probe runs under
LLAMA_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp draws a new seed


class SlotPool:
    """Which slot serves a request. A slot's cached prompt belongs to the identity whose request
    computed it: a request reuses the cache (cache_prompt) only on a slot its own identity used
    last; on any other slot the prompt is computed afresh, so no identity ever gets a prefix
    another one computed (no timing side channel across tenants)."""

    def __init__(self, n: int) -> None:
        self.owner: list[str | None] = [None] * n
        self.busy = [False] * n
        self.waiting = 0
        self._changed = asyncio.Condition()

    async def acquire(self, identity: str,
                      abandoned: Callable[[], bool] = lambda: False) -> tuple[int, bool] | None:
        """(slot, reuse its cache); waits while every slot is busy. None once `abandoned()` says so
        (asked at each `release` and `wake`)."""
        async with self._changed:
            self.waiting += 1
            try:
                await self._changed.wait_for(lambda: abandoned() or not all(self.busy))
            finally:
                self.waiting -= 1
            if abandoned():
                self._changed.notify()  # a release's wake-up it took goes to the next waiter
                return None
            free = [i for i, busy in enumerate(self.busy) if not busy]
            own = [i for i in free if self.owner[i] == identity]
            slot = own[0] if own else next((i for i in free if self.owner[i] is None), free[0])
            reuse = self.owner[slot] == identity
            self.busy[slot], self.owner[slot] = True, identity
            return slot, reuse

    async def release(self, slot: int) -> None:
        async with self._changed:
            self.busy[slot] = False
            self._changed.notify()

    async def wake(self) -> None:
        """Every waiter asks `abandoned()` again."""
        async with self._changed:
            self._changed.notify_all()

    @property
    def running(self) -> int:
        return sum(self.busy)


def server_config(spec: common_pb2.ModelSpec, model_path: str, chat_template: str) -> ServerConfig:
    o = spec.llama_cpp
    if o.HasField("n_gpu_layers"):
        layers = o.n_gpu_layers
    else:
        layers = gpu_layers(spec.num_gpus, int(_gguf_field(model_path, ".block_count"))) if spec.num_gpus > 0 else 0
    embed = spec.usecase == common_pb2.USECASE_EMBED
    # A generative GGUF names no pooling; llama-server then refuses OpenAI embeddings: mean-pool it.
    pooling = "mean" if embed and _gguf_field(model_path, ".pooling_type") is None else ""
    return ServerConfig(
        model_path=model_path, n_ctx=o.n_ctx or spec.max_model_len or DEFAULT_N_CTX,
        n_parallel=o.n_parallel or spec.max_num_seqs or DEFAULT_N_PARALLEL,
        # The replica's CPU share is its thread budget: more threads than cores it may use only
        # contend (measured: 2 threads on a busy 2-core node fell to 3-10 tokens/s).
        n_threads=o.n_threads or (max(1, round(spec.num_cpus)) if spec.num_cpus else 0),
        n_gpu_layers=layers, chat_template=o.chat_template or chat_template,
        embeddings=embed, pooling=pooling, binary=o.server_binary,
        extra_args=list(o.server_args))


def _gguf_field(model_path: str, suffix: str) -> Any:
    """A scalar of the GGUF's metadata by key suffix (`.block_count` of any architecture), or None."""
    from gguf import GGUFReader

    for name, f in GGUFReader(model_path).fields.items():
        if name.endswith(suffix):
            return f.parts[f.data[0]][0]
    return None


class LlamaCppEngine(Engine):
    def __init__(self, server: LlamaServer, client: httpx.AsyncClient, cfg: ServerConfig) -> None:
        self._server, self._client = server, client
        self.max_model_len = cfg.n_ctx
        self.supports_embeddings = cfg.embeddings
        self.slots = SlotPool(cfg.n_parallel)
        self._stats = EngineStats()
        self._streams: dict[str, httpx.Response] = {}  # request id -> its open /completion stream
        self._starting: set[str] = set()  # request ids waiting for a slot, or for their stream to open
        self._aborted: set[str] = set()

    @classmethod
    async def start(cls, spec: common_pb2.ModelSpec, model_ref: str) -> LlamaCppEngine:
        from services.worker.gguf_models import resolve_gguf

        path, template = await asyncio.to_thread(resolve_gguf, model_ref)
        cfg = await asyncio.to_thread(server_config, spec, str(path), template)
        runtime = runtime_class(spec.llama_cpp.runtime)  # llama-server subprocess | in-process xllamacpp
        server = await asyncio.to_thread(runtime.spawn, cfg)
        client = httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(None, connect=5.0),
                                   limits=httpx.Limits(max_connections=cfg.n_parallel + 8))
        try:
            await server.wait_healthy(client)
        except BaseException:
            await client.aclose()
            server.stop()
            raise
        log.info("llama.cpp (%s) for %s on %s: %d slots x %d tokens", runtime.__name__, spec.name, server.url,
                 cfg.n_parallel, cfg.n_ctx)
        engine = cls(server, client, cfg)
        if cfg.embeddings:
            try:
                engine.embedding_dimension = int(await asyncio.to_thread(
                    _gguf_field, cfg.model_path, ".embedding_length"))
            except BaseException:  # the caller never gets this engine to shut down
                await engine.shutdown()
                raise
        return engine

    @property
    def server_url(self) -> str:
        return self._server.url

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        reply = await self._client.post(path, json=body)
        if reply.status_code == 400:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                               f"llama.cpp refused the input: {_message(reply)}")
        if reply.status_code != 200:
            raise ServiceError(grpc.StatusCode.INTERNAL, Reason.ENGINE_ERROR,
                               f"llama-server {path}: {reply.status_code} {_message(reply)}")
        return reply.json()

    async def render(self, req: RenderRequest) -> Prompt:
        identity = req.cache_salt or ""
        if req.prompt_token_ids:
            return Prompt(list(req.prompt_token_ids), identity)
        if req.messages is None:
            text = req.prompt or ""
        else:
            body: dict[str, Any] = {"messages": req.messages, "add_generation_prompt": not req.continue_final_message,
                                    **({"tools": req.tools} if req.tools else {})}
            if req.chat_template_kwargs:
                body["chat_template_kwargs"] = req.chat_template_kwargs
            # llama.cpp's templates leave BOS out: tokenizing adds it where the model wants one
            text = (await self._post("/apply-template", body))["prompt"]
        tokens = (await self._post("/tokenize", {"content": text, "add_special": True,
                                                 "parse_special": True}))["tokens"]
        return Prompt(list(tokens), identity, tail=tail_of(text))

    @staticmethod
    def _check(s: Sampling) -> None:
        if s.n > 1:
            raise invalid_parameter("n", "the llama_cpp loader generates one choice per request (n=1)")
        if s.regex is not None or s.choice:
            raise invalid_parameter("response_format", "llama_cpp supports json_schema and json_object formats")
        if s.min_tokens:
            raise invalid_parameter("min_tokens", "the llama_cpp loader does not support min_tokens")
        # vLLM's extras llama-server has no per-request form of: refused, not silently dropped
        if s.stop_token_ids:
            raise invalid_parameter("stop_token_ids", "the llama_cpp loader does not support stop_token_ids; "
                                    "use 'stop' strings")
        if s.include_stop_str_in_output and s.stop:
            raise invalid_parameter("include_stop_str_in_output", "the llama_cpp loader always leaves the "
                                    "matched stop string out of the output")
        if not s.skip_special_tokens:
            raise invalid_parameter("skip_special_tokens", "the llama_cpp loader always leaves special tokens "
                                    "out of the text")

    def _body(self, prompt: Prompt, s: Sampling, slot: int, reuse: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt.token_ids, "stream": True, "id_slot": slot, "cache_prompt": reuse,
            "n_predict": s.max_tokens or max(1, self.max_model_len - len(prompt.token_ids)),
            "stop": list(s.stop), "ignore_eos": s.ignore_eos, "return_tokens": True,
            # the sampled token's own logprob comes with n_probs >= 1
            "n_probs": max(1, s.logprobs) if s.logprobs is not None else 0}
        body.update({name: getattr(s, field) for field, name in FIELDS.items() if getattr(s, field) is not None})
        if s.seed is not None:  # -1: random, as vLLM has it; any other seed must stay reproducible, but llama.cpp's
            body["seed"] = s.seed % LLAMA_RANDOM_SEED if s.seed != -1 else LLAMA_RANDOM_SEED  # is a uint32
        if s.json_schema is not None or s.json_object:
            body["json_schema"] = s.json_schema if s.json_schema is not None else {"type": "object"}
        return body

    async def generate(self, prompt: Prompt, sampling: Sampling, request_id: str,
                       priority: int = 0) -> AsyncIterator[StepOutput]:
        self._check(sampling)
        self._starting.add(request_id)
        try:
            got = await self.slots.acquire(prompt.engine_input, lambda: request_id in self._aborted)
            if got is not None:  # else aborted while it waited for a slot: it never reaches the server
                try:  # its stream closes before its slot is free (aclosing: not whenever it is collected)
                    async with contextlib.aclosing(self._complete(prompt, sampling, request_id, *got)) as steps:
                        async for step in steps:
                            yield step
                finally:
                    await self.slots.release(got[0])
        finally:
            self._starting.discard(request_id)
            self._streams.pop(request_id, None)
            aborted = request_id in self._aborted
            self._aborted.discard(request_id)
        if aborted:
            yield StepOutput([ChoiceDelta(0, "", 0, finish_reason="abort")], True, len(prompt.token_ids), 0)

    async def _complete(self, prompt: Prompt, sampling: Sampling, request_id: str, slot: int,
                        reuse: bool) -> AsyncIterator[StepOutput]:
        """The request on its slot: llama-server's stream as steps, until it ends or is aborted."""
        body = self._body(prompt, sampling, slot, reuse)
        async with self._client.stream("POST", "/completion", json=body) as reply:
            if reply.status_code != 200:
                await reply.aread()
                raise ServiceError(grpc.StatusCode.INTERNAL, Reason.ENGINE_ERROR,
                                   f"llama-server /completion: {reply.status_code} {_message(reply)}")
            self._streams[request_id] = reply
            self._starting.discard(request_id)
            if request_id in self._aborted:
                return  # aborted while its stream opened: closing it stops the slot
            try:
                async for step in self._steps(reply, prompt, sampling.logprobs):
                    yield step
            except (httpx.StreamError, httpx.TransportError):
                if request_id not in self._aborted:
                    raise

    async def _steps(self, reply: httpx.Response, prompt: Prompt, logprobs: int | None) -> AsyncIterator[StepOutput]:
        """One step per read of the server's stream: the tokens that arrived together (a consumer
        that lags finds several) go on as one delta; the first token is never held back."""
        async for chunks in _arrived_together(reply):
            text: list[str] = []
            delta = ChoiceDelta(0, "", 0)
            last: dict[str, Any] = {}
            for last in chunks:
                if "error" in last:
                    raise ServiceError(grpc.StatusCode.INTERNAL, Reason.ENGINE_ERROR, f"llama.cpp: {last['error']}")
                delta.num_tokens += len(last.get("tokens") or ())
                text.append(last.get("content", ""))
                if logprobs is not None:
                    delta.logprobs += _logprobs(last, logprobs)
                if last.get("stop"):
                    break
            delta.text = "".join(text)
            self._stats.generated_tokens_total += delta.num_tokens
            if not last.get("stop"):
                yield StepOutput([delta], False, len(prompt.token_ids), 0)
                continue
            timings = last.get("timings", {})
            self._stats.prompt_tokens_total += len(prompt.token_ids)
            delta.finish_reason = FINISH.get(last.get("stop_type", ""), "stop")
            delta.stop_sequence = last.get("stopping_word") or None
            yield StepOutput([delta], True, len(prompt.token_ids), int(timings.get("cache_n", 0)))
            return

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            reply = self._streams.pop(request_id, None)
            if reply is not None:
                self._aborted.add(request_id)
                await reply.aclose()  # llama-server stops the slot when its client hangs up
            elif request_id in self._starting:
                self._aborted.add(request_id)  # it ends now if it waits for a slot, else once its stream opens
                await self.slots.wake()

    async def embed(self, inputs: list[str | list[int]], dimensions: int | None) -> tuple[list[list[float]], int]:
        if dimensions is not None:
            raise invalid_parameter("dimensions", "the llama_cpp loader returns the model's own dimension "
                                    f"({self.embedding_dimension}); leave 'dimensions' unset")
        reply = await self._post("/v1/embeddings", {"input": inputs})  # texts or token-id lists alike
        vectors = [item["embedding"] for item in sorted(reply["data"], key=lambda d: d["index"])]
        return vectors, int(reply.get("usage", {}).get("prompt_tokens", 0))

    async def metrics_text(self) -> str | None:
        reply = await self._client.get("/metrics", timeout=5.0)
        return reply.text if reply.status_code == 200 else None

    async def answers_probe(self) -> bool:
        # llama-server's main loop answers /metrics between two batches (a long prompt's too);
        # a hung loop never does. (/health is answered by the HTTP threads alone.)
        with contextlib.suppress(httpx.HTTPError):
            return (await self._client.get("/metrics", timeout=PROBE_TIMEOUT_S)).status_code == 200
        return False

    def kill(self) -> None:
        self._server.kill()

    def stats(self) -> EngineStats:
        self._stats.running_requests, self._stats.waiting_requests = self.slots.running, self.slots.waiting
        return self._stats

    @property
    def errored(self) -> bool:
        return not self._server.alive

    async def shutdown(self) -> None:
        await self._client.aclose()
        await asyncio.to_thread(self._server.stop)


async def _arrived_together(reply: httpx.Response) -> AsyncIterator[list[dict[str, Any]]]:
    """The stream's `data:` events, grouped by the read that delivered them."""
    pending = ""
    async for text in reply.aiter_text():
        *lines, pending = (pending + text).split("\n")
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        if events:
            yield events


def _logprobs(chunk: dict[str, Any], k: int) -> list[TokenLogprob]:
    return [TokenLogprob(token=p.get("token", ""), logprob=float(p.get("logprob", float("-inf"))),
                         top=[TopToken(t.get("token", ""), float(t.get("logprob", float("-inf"))))
                              for t in p.get("top_logprobs", [])[:k]])
            for p in chunk.get("completion_probabilities") or []]


def _message(reply: httpx.Response) -> str:
    try:
        err = reply.json().get("error", {})
        return err.get("message", "") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return reply.text[:200]
