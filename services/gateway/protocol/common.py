"""What chat and completions share: strict wire types, sampling fields and their proto form,
request parsing, ids and time, usage, finish reasons, logprobs and SSE framing.

Wire models are strict the way OpenAI is: unknown fields, a string for a number or a number for a
boolean are 400s naming the field (ints for floats are fine). Values the worker would refuse are
refused here too, so the edge answers without a hop; the worker stays the authority.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar, Union

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.errors import CUSTOM_ERROR, TYPE_ERROR, OpenAIError, from_validation, invalid_json

# ---- strict scalar types -----------------------------------------------------------------------

Float = Annotated[float, Strict(), AllowInfNan(False)]  # strict float still takes ints, not "1" or true
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT32_MAX = 2**32 - 1
MAX_STOP = 4  # OpenAI's limit, and the worker's


class WireModel(BaseModel):
    """A request object: unknown keys are refused (OpenAI answers 400 for them)."""

    model_config = ConfigDict(extra="forbid")


def refuse(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (raise it from a field validator)."""
    return PydanticCustomError(CUSTOM_ERROR, message)  # no context: the text is not formatted


def invalid(loc: str | tuple[str | int, ...], message: str, value: Any = None) -> ValidationError:
    """A validation error at `loc` relative to the model being validated (raise it from a model
    validator; pydantic prefixes the outer path)."""
    return _error(loc, refuse(message), value)


def missing(loc: str | tuple[str | int, ...]) -> ValidationError:
    return _error(loc, "missing", None)


def bad_value(loc: str | tuple[str | int, ...], value: Any, allowed: Iterable[str]) -> ValidationError:
    """The "Invalid value: 'x'. Supported values are: ..." error at `loc`."""
    expected = ", ".join(repr(a) for a in allowed)
    return _error(loc, "literal_error", value, {"expected": expected})


def _error(loc: str | tuple[str | int, ...], kind: Any, value: Any,
           ctx: dict[str, Any] | None = None) -> ValidationError:
    loc = (loc,) if isinstance(loc, str) else loc
    details = InitErrorDetails(type=kind, loc=loc, input=value)
    if ctx is not None:
        details["ctx"] = ctx
    return ValidationError.from_exception_data("request", [details])


def tagged(choose: Callable[[Any], str | None], branches: dict[str, Any], expected: str) -> Any:
    """A union validated against the single branch `choose` names, so errors come from that branch
    only. Branch tags appear in error locations as `<tag>`, which `param_path` drops. When `choose`
    returns None the error reads "expected <expected>"."""
    def pick(value: Any) -> str | None:
        tag = choose(value)
        return None if tag is None else f"<{tag}>"

    members = tuple(Annotated[kind, Tag(f"<{tag}>")] for tag, kind in branches.items())
    return Annotated[Union[members], Discriminator(  # noqa: UP007 (a runtime tuple of members)
        pick, custom_error_type=TYPE_ERROR, custom_error_message=expected)]


def by_type(value: Any) -> str | None:
    """Pick a branch from the JSON type of the input: str, list or dict."""
    for kind, tag in ((str, "str"), (list, "list"), (dict, "dict")):
        if isinstance(value, kind):
            return tag
    return None


def by_field(field: str, known: Iterable[str]) -> Callable[[Any], str | None]:
    """Pick a branch from an object's `field` (e.g. "type", "role"): a `known` value picks its own
    branch, anything else (or no value) picks `other`; a non-object picks none."""
    names = frozenset(known)

    def choose(value: Any) -> str | None:
        if isinstance(value, dict):
            tag = value.get(field)
        elif isinstance(value, BaseModel):
            tag = getattr(value, field, None)
        else:
            return None
        return tag if isinstance(tag, str) and tag in names else "other"
    return choose


Stop = tagged(by_type, {"str": Str, "list": Annotated[list[Str], Field(max_length=MAX_STOP)]},
              "a string or an array of strings")


class StreamOptions(WireModel):
    include_usage: Bool | None = None
    include_obfuscation: Bool | None = None  # accepted and ignored: we add no obfuscation padding


# ---- sampling fields shared by chat and completions --------------------------------------------

class SamplingFields(WireModel):
    """OpenAI's sampling fields common to both endpoints, then vLLM's extras (as vLLM accepts them)."""

    model: Str
    frequency_penalty: Float | None = Field(None, ge=-2, le=2)
    presence_penalty: Float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[Str, Float] | None = None
    max_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)
    n: Int | None = Field(None, ge=1, le=INT32_MAX)
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
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is "
                          "enabled.", None)
        max_tokens = self.effective_max_tokens
        if self.min_tokens is not None and max_tokens is not None and self.min_tokens > max_tokens:
            raise invalid("min_tokens", f"Invalid 'min_tokens': must not exceed the maximum number of tokens "
                          f"({max_tokens}), got {self.min_tokens}.", self.min_tokens)
        return self


def sampling_params(req: SamplingFields, *, logprobs: bool, top_logprobs: int | None) -> pb.SamplingParams:
    """The proto form of the sampling fields; unset fields stay unset (engine defaults)."""
    out = pb.SamplingParams(
        stop=req.stop_list, stop_token_ids=req.stop_token_ids or [], ignore_eos=bool(req.ignore_eos),
        logprobs=logprobs, keep_special_tokens=req.skip_special_tokens is False,
        include_stop_str_in_output=bool(req.include_stop_str_in_output))
    values = {"max_tokens": req.effective_max_tokens, "temperature": req.temperature, "top_p": req.top_p,
              "top_k": req.top_k, "min_p": req.min_p, "presence_penalty": req.presence_penalty,
              "frequency_penalty": req.frequency_penalty, "repetition_penalty": req.repetition_penalty,
              "seed": req.seed, "min_tokens": req.min_tokens, "n": req.n,
              "top_logprobs": top_logprobs if logprobs else None}
    for name, value in values.items():
        if value is not None:
            setattr(out, name, value)
    return out


def build_request(build: Callable[[], pb.InferRequest]) -> pb.InferRequest:
    """Run a proto builder; text the proto cannot hold (lone surrogates from JSON escapes) is a 400."""
    try:
        return build()
    except ValueError as e:  # UnicodeEncodeError included
        raise OpenAIError(400, f"The request contains a value that cannot be encoded: {e}") from e


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes | str | dict[str, Any]) -> M:
    """Parse a raw JSON body (or an already decoded object) into `model`; OpenAIError 400 otherwise."""
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise invalid_json() from e
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation(e) from e


# ---- ids, time ---------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    """`chatcmpl-…`, `cmpl-…`, `call_…` style ids."""
    sep = "_" if prefix == "call" else "-"
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def now() -> int:
    """OpenAI's `created`: unix seconds."""
    return int(time.time())


# ---- responses -----------------------------------------------------------------------------------

FINISH_REASONS: dict[int, str] = {
    pb.FINISH_REASON_UNSPECIFIED: "stop",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
    # OpenAI has no "cancelled": the SDK's types reject anything else, and "length" would tell the
    # caller to raise max_tokens. A cancelled choice ends as it stands, like a stop.
    pb.FINISH_REASON_CANCELLED: "stop",
}


def finish_reason(reason: int, *, tools: bool = True) -> str:
    """The OpenAI finish_reason; FINISH_REASON_ERROR raises a 500 (the engine failed mid-way)."""
    if reason == pb.FINISH_REASON_ERROR:
        raise OpenAIError(500, "The model failed to generate a response. Please retry your request.",
                          type="server_error", code="engine_error")
    out = FINISH_REASONS.get(reason, "stop")
    return out if tools or out != "tool_calls" else "stop"


def all_cancelled(final: pb.Final | None) -> bool:
    """Every choice was ended by Cancel: the route may answer 499 rather than a partial result."""
    return final is not None and bool(final.choices) and all(
        c.finish_reason == pb.FINISH_REASON_CANCELLED for c in final.choices)


def usage_dict(usage: common_pb2.Usage | None) -> dict[str, Any]:
    u = usage or common_pb2.Usage()
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


def finite(logprob: float) -> float:
    """-inf (and NaN) are not JSON; vLLM's convention is -9999.0."""
    return logprob if math.isfinite(logprob) else -9999.0


def _bytes(token: str, raw: bytes) -> list[int]:
    return list(raw or token.encode())


def chat_logprobs(items: Iterable[pb.TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` entries."""
    return [{"token": lp.token, "logprob": finite(lp.logprob), "bytes": _bytes(lp.token, lp.bytes),
             "top_logprobs": [{"token": t.token, "logprob": finite(t.logprob), "bytes": _bytes(t.token, t.bytes)}
                              for t in lp.top]} for lp in items]


class LegacyLogprobs:
    """The completions API's logprobs: parallel lists with character offsets into the returned text."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset  # where the next token starts in the choice's text

    def encode(self, items: Iterable[pb.TokenLogprob]) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in items:
            out["tokens"].append(lp.token)
            out["token_logprobs"].append(finite(lp.logprob))
            # "up to logprobs+1 elements": the alternatives, plus the sampled token itself
            top = {t.token: finite(t.logprob) for t in lp.top}
            top.setdefault(lp.token, finite(lp.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(lp.token)
        return out

    @staticmethod
    def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {key: [v for p in parts for v in p[key]] for key in ("tokens", "token_logprobs", "top_logprobs",
                                                                   "text_offset")}


SSE_DONE = b"data: [DONE]\n\n"


def sse_event(obj: Any) -> bytes:
    """One server-sent event: `data: <json>\\n\\n`."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"

