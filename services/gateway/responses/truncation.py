"""`truncation: "auto"`: a turn whose prompt the worker refuses as longer than the model's context
is sent again without its oldest conversation items, before any of its output goes out.

Only the worker can count the prompt's tokens, so its refusal (CONTEXT_TOO_LONG, with
`prompt_tokens` and `max_model_len`) says how much is too much; the items to leave out are
estimated from their share of the prompt's text, whole exchanges at a time (the chat then starts
at a user message, as chat templates expect), and a call goes with its outputs. Never left out:
`instructions`, system and developer messages, and the conversation from its last user message
on (without one, this turn's input). At most MAX_ATTEMPTS tries; then, or when nothing more can
go, the refusal is the client's 400 (context_length_exceeded), as with truncation "disabled".

What was left out is left out of the stored conversation too (`Turn.context`): a continuation
would only be truncated again, and the chain then holds what the model was shown. The response's
input items stay the request's, all of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError
from services.common.routes import RouteTable
from services.gateway.admission.admission import Ticket
from services.gateway.generation import Generation, open_generation
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.protocol_items import to_messages
from services.gateway.responses.turns import Turn

MAX_ATTEMPTS = 4  # the first and three shorter ones: each estimate is corrected by the next refusal
_NOT_TEXT = frozenset({"id", "type", "role", "status", "call_id"})  # not rendered as prompt text


class _Held(Ticket):
    """The turn's admission across attempts: an attempt refused before it started gives the
    reservation back (settle(0)); the next attempt runs under that same reservation, so nothing is
    settled until one starts (`started`), or the caller gives up."""

    def __init__(self, ticket: Ticket) -> None:
        super().__init__(prompt_estimate=ticket.prompt_estimate)
        self.ticket, self.started = ticket, False

    @property
    def counts_tokens(self) -> bool:
        return self.ticket.counts_tokens

    def settle(self, used: int) -> None:
        if self.started:
            self.ticket.settle(used)


def context_refusal(e: OpenAIError) -> tuple[int, int] | None:
    """(prompt tokens, context length) of a worker's CONTEXT_TOO_LONG refusal, else None."""
    cause = e.__cause__
    if e.code != "context_length_exceeded" or not isinstance(cause, UpstreamError):
        return None
    try:
        return int(cause.details.metadata["prompt_tokens"]), int(cause.details.metadata["max_model_len"])
    except (KeyError, ValueError):
        return None


def _weight(value: Any) -> int:
    """An item's share of the prompt: the length of its text (ids and type tags are not rendered)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_weight(v) for k, v in value.items() if k not in _NOT_TEXT)
    if isinstance(value, list):
        return sum(_weight(v) for v in value)
    return 0


def _role(item: dict[str, Any]) -> str | None:
    return item.get("role") if item.get("type", "message") == "message" else None


def protected_from(history: Sequence[dict[str, Any]], inputs: Sequence[dict[str, Any]]) -> int:
    """The index in history + inputs from which nothing is left out: the last user message, or
    this turn's input when the conversation has none."""
    items = [*history, *inputs]
    return next((i for i in range(len(items) - 1, -1, -1) if _role(items[i]) == "user"), len(history))


def shorter(items: Sequence[dict[str, Any]], dropped: set[int], protect: int, excess_share: float,
            fixed: int = 0) -> set[int]:
    """The indices of `items` to leave out from now on: `dropped`, then the oldest items outside
    the protected tail worth at least `excess_share` of the text still sent (`fixed`: the length of
    the text always sent, the instructions), to the next user message. Equal to `dropped` when
    nothing more can go."""
    weights = [_weight(i) for i in items]
    need = excess_share * (fixed + sum(w for i, w in enumerate(weights) if i not in dropped))
    outputs: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if item.get("type") == "function_call_output":
            outputs.setdefault(item.get("call_id", ""), []).append(i)
    out, freed = set(dropped), 0
    for i in range(protect):
        item = items[i]
        if i in out or _role(item) in ("system", "developer"):
            continue
        if freed >= need and _role(item) == "user":
            break  # whole exchanges: the chat goes on from a user message
        group = [i, *outputs.get(item.get("call_id", ""), [])] if item.get("type") == "function_call" else [i]
        if any(j >= protect for j in group):
            break  # its output is in the protected tail: the call stays, and so does all after it
        out.update(group)
        freed += sum(weights[j] for j in group)
    return out


async def open_fitting(table: RouteTable, turn: Turn, infer: pb.InferRequest, ticket: Ticket,
                       output: Sequence[dict[str, Any]] = ()) -> Generation:
    """Open the turn's generation for `infer` (its chat: the turn's context, then `output`, this
    response's items so far); with truncation "auto", one the worker refuses as too long is tried
    again without the oldest items (recorded in `turn.dropped`). Raises OpenAIError."""
    def open_(attempt_ticket: Ticket) -> Awaitable[Generation]:
        return open_generation(table, turn.req.model, infer, input_param="input", ticket=attempt_ticket,
                               identity=turn.identity)
    if turn.req.truncation != "auto":
        return await open_(ticket)
    held = _Held(ticket)
    items, protect = [*turn.history, *turn.inputs], protected_from(turn.history, turn.inputs)
    reserve = max(infer.sampling.max_tokens if infer.sampling.HasField("max_tokens") else 1, 1)
    fixed = len(turn.req.instructions or "")
    attempts = 0
    try:
        while True:
            attempts += 1
            try:
                generation = await open_(held)
            except OpenAIError as e:
                refusal = context_refusal(e)
                # limit <= reserve: max_output_tokens alone fills the context, no prompt fits
                if refusal is None or attempts == MAX_ATTEMPTS or refusal[1] <= reserve or refusal[0] <= 0:
                    raise
                prompt_tokens, limit = refusal
                # the prompt must come down to limit - reserve tokens (the worker's own check)
                excess = (prompt_tokens - (limit - reserve)) / prompt_tokens
                dropped = shorter(items, turn.dropped, protect, excess, fixed)
                if dropped == turn.dropped:
                    raise
                turn.dropped = dropped
                del infer.chat.messages[:]
                infer.chat.messages.extend(to_messages(turn.req.instructions, turn.context, output))
                continue
            held.started = True
            return generation
    finally:
        if not held.started:
            ticket.settle(0)  # no attempt started: the reservation goes back
