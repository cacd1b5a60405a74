"""One Responses turn: the request prepared (conversation so far, worker request, encoder), and
the one loop that feeds the worker's events to the encoder, used by foreground turns (streamed
or not), WebSocket turns, background runs and compaction alike."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mship.state.v1 import state_pb2 as spb
from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError
from services.gateway.admission.admission import FREE, Ticket
from services.gateway.edge.sse import sse_response_stream
from services.gateway.generation import Generation
from services.gateway.responses.conversation import snapshot_of
from services.gateway.responses.protocol import ResponseRequest
from services.gateway.responses.protocol_events import ResponseStreamEncoder
from services.gateway.responses.protocol_mcp_events import McpStreamEncoder

Events = list[dict[str, Any]]
# Called with the batch holding the terminal event before it goes out; returns what goes out instead.
Finish = Callable[[Events], Awaitable[Events]]


@dataclass
class Turn:
    """One prepared turn: the request, its conversation so far, its worker request and encoder."""

    req: ResponseRequest
    identity: str
    history: list[dict[str, Any]]
    inputs: list[dict[str, Any]]
    encoder: ResponseStreamEncoder
    infer: pb.InferRequest
    ticket: Ticket = FREE  # its admission (the token reservation its generation settles)
    # truncation "auto": the items of history + inputs (their indices) the model is not shown
    dropped: set[int] = field(default_factory=set)

    def snapshot(self, response: dict[str, Any]) -> spb.StoredResponse:
        return snapshot_of(self.identity, response, self.history, self.inputs, self.req.previous_response_id,
                           context=self.context if self.dropped else None)

    @property
    def context(self) -> list[dict[str, Any]]:
        """The conversation the model is shown: the history, then this turn's input, less what
        truncation left out (see truncation.py)."""
        items = [*self.history, *self.inputs]
        return [item for i, item in enumerate(items) if i not in self.dropped] if self.dropped else items

    @property
    def runs_tools(self) -> bool:
        """Its tools include MCP servers: the server runs the tool loop (`mcp_loop`)."""
        return isinstance(self.encoder, McpStreamEncoder)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        return [*self.context, *self.encoder.response["output"]]


async def run_turn(encoder: ResponseStreamEncoder, generation: Generation, finish: Finish,
                   opening: Events | None = None) -> AsyncIterator[Events]:
    """Yield `opening` (if any), then each worker event's batch of stream events; the last batch
    holds the terminal event and passes through `finish` first (store the snapshot, write the run).
    A call that breaks, or ends without a Final, fails the response (an `error` event first for a
    break). Closing this generator early (also at `opening`) cancels the worker call."""
    try:
        if opening:
            yield opening
        async for event in generation:
            out = encoder.encode(event)
            if encoder.done:
                break
            if out:
                yield out
        else:
            out = encoder.fail()  # ended without a Final
    except UpstreamError as e:
        out = encoder.error_out(generation.failure(e))
    finally:
        generation.close()
    yield await finish(out)


class EventBatches:
    """Batches of Responses events to send (iterate once) and the worker call they come from, if
    any. `release()` cancels that call (idempotent); a sender calls it however sending ends, also
    when it never started iterating (a client gone before the first byte), because a generator
    that never started never runs its `finally`."""

    def __init__(self, batches: AsyncGenerator[Events, None], generation: Generation | None = None) -> None:
        self._batches, self._generation = batches, generation

    def __aiter__(self) -> AsyncIterator[Events]:
        return self._batches

    def frames(self) -> AsyncIterator[bytes]:
        """The batches as one event stream (each event with its `event:` line), then `[DONE]`."""
        return sse_response_stream(self)

    def release(self) -> None:
        if self._generation is not None:
            self._generation.close()

    async def aclose(self) -> None:
        try:
            await self._batches.aclose()
        finally:  # also when a second cancellation interrupts the generator's own cleanup
            self.release()
