"""Admission: a request spends one request and reserves its tokens (prompt estimate + max_tokens)
from its caller's buckets for the model before any engine work; the reservation is settled
against the real usage when the worker call ends (a cancelled call gives back what it did not use).

Refused: 429 with `Retry-After` and the `x-ratelimit-*` headers OpenAI sends (granted requests
carry the headers too). With no limit for the caller and model, nothing is looked up (no store
call on the hot path). A store that fails (Redis down) admits and logs: rate limits protect the
hardware from one tenant; they must not take the whole edge down with Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from typing import Any

from services.common.routes import RouteTable
from services.gateway.admission.buckets import Bucket, BucketStore, Draw, MemoryBuckets
from services.gateway.admission.overrides import RateLimitOverrides
from services.gateway.identity import Caller
from services.gateway.protocol_common.openai_error import OpenAIError, retry_after_header

log = logging.getLogger(__name__)
BYTES_PER_TOKEN = 4           # the prompt's estimate before the engine has tokenized it
DEFAULT_COMPLETION_RESERVE = 1024  # reserved when a request names no max_tokens (capped by the context)
STORE_ERROR_LOG_EVERY_S = 10.0


def estimate_tokens(prompt_bytes: int) -> int:
    return max(1, math.ceil(prompt_bytes / BYTES_PER_TOKEN))


def duration(seconds: float) -> str:
    """OpenAI's spelling of a reset time: `20ms`, `1.5s`, `6m0s`."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{text}s" if minutes else f"{text}s"


def _headers(kind: str, draw: Draw) -> dict[str, str]:
    return {f"x-ratelimit-limit-{kind}": str(draw.limit), f"x-ratelimit-remaining-{kind}": str(draw.remaining),
            f"x-ratelimit-reset-{kind}": duration(draw.reset_s)}


class Ticket:
    """An admitted request's token reservation; `settle(used)` once it is known (idempotent). It
    also records the usage on its caller when the audit trail wants it (`record`)."""

    def __init__(self, admission: Admission | None = None, key: str = "", limit: int = 0, reserved: int = 0,
                 prompt_estimate: int = 0, record: Caller | None = None) -> None:
        self._admission, self.key, self.limit = admission, key, limit
        self.reserved, self.prompt_estimate, self._record = reserved, prompt_estimate, record
        self._settled = admission is None and record is None

    @property
    def counts_tokens(self) -> bool:
        return not self._settled

    def settle(self, used: int) -> None:
        if self._settled:
            return
        self._settled = True
        if self._record is not None:
            self._record.used_tokens = used
        if self._admission is not None and used != self.reserved:
            self._admission.adjust_later(self.key, self.limit, self.reserved - used)


    def follow_on(self) -> Ticket:
        """A later generation of the same request (an MCP turn's continuation with tool results):
        nothing reserved for it, what it uses charged to the same budget and added to the usage
        recorded for the caller."""
        if self._admission is None and self._record is None:
            return self
        return _FollowOn(self._admission, self.key, self.limit, record=self._record)


class _FollowOn(Ticket):
    def settle(self, used: int) -> None:
        if self._settled:
            return
        self._settled = True
        if self._record is not None:
            self._record.used_tokens = (self._record.used_tokens or 0) + used
        if self._admission is not None and used:
            self._admission.adjust_later(self.key, self.limit, -used)


FREE = Ticket()  # no token limit, nothing recorded: nothing to settle


class Admission:
    def __init__(self, table: RouteTable, store: BucketStore | None = None,
                 overrides: RateLimitOverrides | None = None, record_usage: bool = False) -> None:
        self.table, self.record_usage = table, record_usage  # record_usage: the audit trail wants tokens
        self.store: BucketStore = store or MemoryBuckets()
        self.overrides = overrides or RateLimitOverrides()
        self._pending: set[asyncio.Task] = set()
        self._last_error_log = 0.0

    async def admit_generation(self, caller: Caller, model: str, prompt_bytes: int, infer: Any) -> Ticket:
        """`admit` for a worker InferRequest: its max_tokens (or the default reserve when it names
        none) for each of its `n` choices."""
        sampling = infer.sampling
        return await self.admit(caller, model, prompt_bytes=prompt_bytes,
                                max_tokens=sampling.max_tokens if sampling.HasField("max_tokens") else None,
                                choices=sampling.n if sampling.HasField("n") else 1)

    async def admit(self, caller: Caller, model: str, *, prompt_bytes: int, max_tokens: int | None,
                    choices: int = 1) -> Ticket:
        """The caller's ticket for one request to `model` (routed: `check_routed` ran), or 429.
        `max_tokens` None: the default completion reserve (an embedding request reserves 0); each
        of `choices` (a request's `n`) may use that much."""
        caller.model = model
        route = self.table.routes.get(model)
        base = (route.requests_per_minute, route.tokens_per_minute) if route else (0, 0)
        rpm, tpm = self.overrides.limits(caller.identity, model, base)
        estimate = estimate_tokens(prompt_bytes)
        record = caller if self.record_usage else None
        # no token bucket to settle: only the audit trail may want the usage
        untracked = FREE if record is None else Ticket(prompt_estimate=estimate, record=record)
        if not rpm and not tpm:
            return untracked
        scope = hashlib.sha256(f"{caller.rate_key}\0{model}".encode()).hexdigest()[:32]
        buckets, kinds = [], []
        if rpm:
            buckets.append(Bucket(scope + ":r", rpm, 1))
            kinds.append("requests")
        if tpm:
            context = route.max_model_len if route and route.max_model_len else DEFAULT_COMPLETION_RESERVE
            per_choice = min(DEFAULT_COMPLETION_RESERVE, context) if max_tokens is None else max_tokens
            completion = max(0, per_choice) * max(1, choices)  # n choices may each use max_tokens
            # never more than a full bucket: a big request waits for a full bucket, it is not refused forever
            buckets.append(Bucket(scope + ":t", tpm, min(tpm, estimate + completion)))
            kinds.append("tokens")
        try:
            granted, draws = await self.store.take(buckets)
        except Exception as e:  # any store failure admits (see the module doc)
            self._log_store_error(e)
            return untracked
        for kind, draw in zip(kinds, draws, strict=True):
            caller.response_headers.update(_headers(kind, draw))
        if not granted:
            raise self._refusal(kinds, draws)
        if not tpm:
            return untracked
        return Ticket(self, buckets[-1].key, tpm, buckets[-1].cost, estimate, record)

    def _refusal(self, kinds: list[str], draws: list[Draw]) -> OpenAIError:
        kind, draw = max(zip(kinds, draws, strict=True), key=lambda kd: kd[1].retry_after_s)
        wait = draw.retry_after_s
        return OpenAIError(
            429, f"Rate limit reached for {kind} per minute: limit {draw.limit}, requested {draw.cost}. "
                 f"Please try again in {duration(wait)}.",
            # the x-ratelimit-* headers are in caller.response_headers: the edge sends them on every answer
            type=kind, code="rate_limit_exceeded", headers=retry_after_header(wait))

    def adjust_later(self, key: str, limit: int, delta: float) -> None:
        """Settle off the response path (a generation's close is synchronous)."""
        task = asyncio.get_running_loop().create_task(self._adjust(key, limit, delta))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _adjust(self, key: str, limit: int, delta: float) -> None:
        try:
            await self.store.adjust(key, limit, delta)
        except Exception as e:
            self._log_store_error(e)

    def _log_store_error(self, e: Exception) -> None:
        if (now := time.monotonic()) - self._last_error_log >= STORE_ERROR_LOG_EVERY_S:
            self._last_error_log = now
            log.warning("rate-limit store failed, admitting without limits: %r", e)

    async def settled(self) -> None:
        """Wait for the settlements under way (tests, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
