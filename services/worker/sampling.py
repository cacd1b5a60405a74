"""Validate an InferRequest's sampling parameters into an engine-neutral `Sampling`.

Every bound is checked here, before any engine work, and a bad value becomes INVALID_ARGUMENT
with a BadRequest violation naming the field (the edge turns that into `error.param`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mship.worker.v1 import worker_pb2
from services.common.errors import invalid_parameter

MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
MAX_N = 16


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    logprobs: int | None = None  # None = off; k = sampled token + k alternatives
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # structured output: at most one of these
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def _opt(msg, name: str):
    return getattr(msg, name) if msg.HasField(name) else None


def _range(name: str, value: float | None, lo: float, hi: float, *, lo_open: bool = False) -> None:
    if value is None:
        return
    if value != value or value < lo or value > hi or (lo_open and value == lo):  # NaN fails too
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise invalid_parameter(name, f"{name} must be in {bound}, got {value}")


def sampling_from_request(req: worker_pb2.InferRequest) -> Sampling:
    """Validate `req.sampling` and `req.response_format`; raise ServiceError on the first bad field."""
    p = req.sampling
    max_tokens = _opt(p, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise invalid_parameter("max_tokens", f"max_tokens must be at least 1, got {max_tokens}")
    temperature = _opt(p, "temperature")
    _range("temperature", temperature, 0.0, 2.0)
    top_p = _opt(p, "top_p")
    _range("top_p", top_p, 0.0, 1.0, lo_open=True)
    top_k = _opt(p, "top_k")
    if top_k is not None and top_k < -1:
        raise invalid_parameter("top_k", f"top_k must be -1 (off) or at least 1, got {top_k}")
    min_p = _opt(p, "min_p")
    _range("min_p", min_p, 0.0, 1.0)
    presence = _opt(p, "presence_penalty")
    _range("presence_penalty", presence, -2.0, 2.0)
    frequency = _opt(p, "frequency_penalty")
    _range("frequency_penalty", frequency, -2.0, 2.0)
    repetition = _opt(p, "repetition_penalty")
    if repetition is not None and not repetition > 0:
        raise invalid_parameter("repetition_penalty", f"repetition_penalty must be > 0, got {repetition}")
    if len(p.stop) > MAX_STOP_SEQUENCES:
        raise invalid_parameter("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
    if any(not s for s in p.stop):
        raise invalid_parameter("stop", "stop sequences must not be empty")
    min_tokens = _opt(p, "min_tokens") or 0
    if min_tokens < 0:
        raise invalid_parameter("min_tokens", f"min_tokens must be >= 0, got {min_tokens}")
    if max_tokens is not None and min_tokens > max_tokens:
        raise invalid_parameter("min_tokens", "min_tokens must not exceed max_tokens")
    n = _opt(p, "n")
    if n is not None and not 1 <= n <= MAX_N:
        raise invalid_parameter("n", f"n must be in [1, {MAX_N}], got {n}")
    top_logprobs = _opt(p, "top_logprobs")
    if top_logprobs is not None:
        if not p.logprobs:
            raise invalid_parameter("top_logprobs", "top_logprobs requires logprobs to be true")
        _range("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)
    return Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p,
        # 0 asks for "off" like -1; unset would leave it to the engine (llama.cpp's default is 40)
        top_k=-1 if top_k == 0 else top_k, min_p=min_p, presence_penalty=presence,
        frequency_penalty=frequency, repetition_penalty=repetition, seed=_opt(p, "seed"),
        stop=tuple(p.stop), stop_token_ids=tuple(p.stop_token_ids), ignore_eos=p.ignore_eos,
        min_tokens=min_tokens, n=n or 1, logprobs=(top_logprobs or 0) if p.logprobs else None,
        skip_special_tokens=not p.keep_special_tokens,
        include_stop_str_in_output=p.include_stop_str_in_output, **_structured(req.response_format))


def _structured(fmt: worker_pb2.ResponseFormat) -> dict[str, Any]:
    kind = fmt.WhichOneof("format")
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        try:
            schema = json.loads(fmt.json_schema.schema_json or "{}")
        except json.JSONDecodeError as e:
            raise invalid_parameter("response_format.json_schema.schema", f"schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict):
            raise invalid_parameter("response_format.json_schema.schema", "schema must be a JSON object")
        return {"json_schema": schema}
    if kind == "regex":
        return {"regex": fmt.regex}
    if kind == "choice":
        if not fmt.choice.choices:
            raise invalid_parameter("response_format.choice", "choice needs at least one option")
        return {"choice": tuple(fmt.choice.choices)}
    return {}
