"""Sampling fields chat and completions share (OpenAI's, then vLLM's extras), and the proto form
of a request's sampling. Values the worker would refuse are refused here too, so the edge answers
without a hop; the worker stays the authority."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from google.protobuf.message import Message
from pydantic import Field, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.protocol_common.validation import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    UINT32_MAX,
    Bool,
    Float,
    Int,
    Str,
    WireModel,
    by_type,
    invalid,
    tagged,
)

MAX_STOP = 4  # OpenAI's limit, and the worker's
MAX_N = 128  # OpenAI's limit on choices per request

Stop = tagged(by_type, {"str": Str, "list": Annotated[list[Str], Field(max_length=MAX_STOP)]},
              "a string or an array of strings")


class StreamOptions(WireModel):
    include_usage: Bool | None = None
    include_obfuscation: Bool | None = None  # accepted and ignored: we add no obfuscation padding


class SamplingFields(WireModel):
    """OpenAI's sampling fields common to both endpoints, then vLLM's extras (as vLLM accepts them)."""

    model: Str
    frequency_penalty: Float | None = Field(None, ge=-2, le=2)
    presence_penalty: Float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[Str, Float] | None = None
    max_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)
    n: Int | None = Field(None, ge=1, le=MAX_N)
    seed: Int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: Stop | None = None
    stream: Bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Float | None = Field(None, ge=0, le=2)
    top_p: Float | None = Field(None, gt=0, le=1)
    user: Str | None = None
    # vLLM's extra sampling parameters
    top_k: Int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: Float | None = Field(None, ge=0, le=1)
    repetition_penalty: Float | None = Field(None, gt=0)
    ignore_eos: Bool | None = None
    min_tokens: Int | None = Field(None, ge=0, le=INT32_MAX)
    stop_token_ids: list[Annotated[Int, Field(ge=0, le=UINT32_MAX)]] | None = None
    skip_special_tokens: Bool | None = None
    include_stop_str_in_output: Bool | None = None

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @model_validator(mode="after")
    def _check_sampling(self) -> SamplingFields:
        if self.logit_bias:
            # the worker's SamplingParams has no logit bias; silently dropping it would change outputs
            raise invalid("logit_bias", "logit_bias is not supported by this server.", self.logit_bias)
        if any(not s for s in self.stop_list):
            raise invalid("stop", "Invalid 'stop': stop sequences must not be empty.", self.stop)
        check_stream_options(self.stream_options, self.stream)
        max_tokens = self.effective_max_tokens
        if self.min_tokens is not None and max_tokens is not None and self.min_tokens > max_tokens:
            raise invalid("min_tokens", f"Invalid 'min_tokens': must not exceed the maximum number of tokens "
                          f"({max_tokens}), got {self.min_tokens}.", self.min_tokens)
        return self


def check_stream_options(stream_options: Any, stream: bool | None) -> None:
    if stream_options is not None and not stream:
        raise invalid("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is "
                      "enabled.", None)


def set_present(message: Message, values: Mapping[str, Any]) -> Message:
    """Set each field of `values` that is not None; unset fields stay unset (engine defaults)."""
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)
    return message


def sampling_params(req: SamplingFields, *, logprobs: bool, top_logprobs: int | None) -> pb.SamplingParams:
    """The proto form of the sampling fields."""
    out = pb.SamplingParams(
        stop=req.stop_list, stop_token_ids=req.stop_token_ids or [], ignore_eos=bool(req.ignore_eos),
        logprobs=logprobs, keep_special_tokens=req.skip_special_tokens is False,
        include_stop_str_in_output=bool(req.include_stop_str_in_output))
    return set_present(out, {
        "max_tokens": req.effective_max_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "top_k": req.top_k, "min_p": req.min_p, "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty, "repetition_penalty": req.repetition_penalty,
        "seed": req.seed, "min_tokens": req.min_tokens, "n": req.n,
        "top_logprobs": top_logprobs if logprobs else None})


def build_request(build: Callable[[], pb.InferRequest]) -> pb.InferRequest:
    """Run a proto builder; text the proto cannot hold (lone surrogates from JSON escapes) is a 400."""
    try:
        return build()
    except ValueError as e:  # UnicodeEncodeError included
        raise unencodable(e) from e


def unencodable(e: ValueError) -> OpenAIError:
    return OpenAIError(400, f"The request contains a value that cannot be encoded: {e}")
