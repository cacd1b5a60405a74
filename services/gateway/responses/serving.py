"""`/v1/responses`: create (foreground, streamed or not, or background), retrieve, resume, delete,
cancel, input items, compaction. Stored responses are scoped by caller identity.

HTTP-free: the router parses the request and builds the HTTP response; a method returns a JSON
object or the event batches to stream. `guard` wraps the waits a client can walk away from (the
router's disconnect watch); the WebSocket passes none.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from mship.state.v1 import state_pb2 as spb
from services.common.routes import RouteTable
from services.gateway.admission.admission import Admission
from services.gateway.edge.answer import Guard, unguarded
from services.gateway.generation import Generation, check_routed
from services.gateway.identity import Caller, cache_salt_for
from services.gateway.protocol_common.images import check_image_input
from services.gateway.protocol_common.openai_error import OpenAIError, internal_error
from services.gateway.responses.background import BackgroundRuns, replayed
from services.gateway.responses.compaction import SUMMARY_MAX_TOKENS, SUMMARY_PROMPT, CompactionCodec
from services.gateway.responses.conversation import (
    check_snapshot_size,
    item_dict,
    load_history,
    store_error,
    store_unavailable,
)
from services.gateway.responses.mcp_loop import check_approvals, opener, run_mcp_turn
from services.gateway.responses.protocol import ResponseRequest, parse_compact_request, parse_response_request
from services.gateway.responses.protocol import to_infer_request as infer_request
from services.gateway.responses.protocol_events import ResponseStreamEncoder, error_event
from services.gateway.responses.protocol_items import check_call_ids, to_messages
from services.gateway.responses.protocol_mcp_events import McpStreamEncoder
from services.gateway.responses.truncation import open_fitting
from services.gateway.responses.turns import EventBatches, Events, Finish, Turn, run_turn
from services.state.client import Conflict, NotFound, StateClient, StateError


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", param="response_id",
                       code="response_not_found")


class ResponsesServing:
    def __init__(self, table: RouteTable, state: StateClient, owner: str, codec: CompactionCodec,
                 admission: Admission | None = None) -> None:
        self.table, self.state, self.codec = table, state, codec
        self.admission = admission or Admission(table)
        self._runs = BackgroundRuns(table, state, owner)

    async def stop(self) -> None:
        """Stop this replica's background runs (their leases then report them failed)."""
        await self._runs.stop()

    # ---- a turn: everything that can be refused is refused in `prepare`, before engine work ---------
    async def prepare(self, req: ResponseRequest, caller: Caller, size: int,
                      history: list[dict[str, Any]] | None = None) -> Turn:
        """`size`: the request's bytes (its prompt estimate for admission)."""
        check_routed(self.table, req.model)
        check_image_input(req.model, self.table.routes[req.model].accepts_images, req.image_parts())
        if req.should_store and self.state.known_down():  # known without asking: no round trip
            raise store_unavailable()
        identity = caller.identity
        if history is None:
            history = await load_history(self.state, identity, req.previous_response_id)
        check_call_ids(history, req.input_items)
        inputs = self.codec.expand(req.input_items)
        stored_inputs = [item_dict(i) for i in inputs]
        if req.should_store:
            check_snapshot_size(history, stored_inputs, size)
        messages = to_messages(req.instructions, history, inputs)
        servers = req.mcp_servers
        check_approvals(history, stored_inputs, servers)
        encoder = (McpStreamEncoder if servers else ResponseStreamEncoder).for_request(req)
        infer = infer_request(req, messages, request_id=encoder.id, cache_salt=cache_salt_for(identity))
        ticket = await self.admission.admit_generation(caller, req.model, size, infer)
        return Turn(req, identity, history, stored_inputs, encoder, infer, ticket)

    async def open(self, turn: Turn) -> Generation:
        return await open_fitting(self.table, turn, turn.infer, turn.ticket)

    def events(self, turn: Turn, generation: Generation | None, finish: Finish,
               opening: Events | None = None) -> AsyncIterator[Events]:
        """The turn's event batches: one generation's, or the MCP tool loop's (which opens its own)."""
        if turn.runs_tools:
            return run_mcp_turn(turn, opener(self.table, turn), finish, opening)
        assert generation is not None
        return run_turn(turn.encoder, generation, finish, opening)

    def stream(self, turn: Turn, generation: Generation | None) -> EventBatches:
        """The turn's events, from `response.created`; the snapshot is stored before the terminal
        event goes out, so a client that saw `response.completed` can always continue from it."""
        async def store_then_end(out: Events) -> Events:
            if turn.encoder.status != "failed":
                try:
                    await self._store(turn)
                except OpenAIError as e:
                    out = [*out[:-1], turn.encoder.error_event(e)]
            return out
        return EventBatches(self.events(turn, generation, store_then_end, opening=turn.encoder.start()),
                            generation)

    async def _whole(self, turn: Turn, generation: Generation | None) -> dict[str, Any]:
        """Run the turn to its end: the response object (failed by the engine: its HTTP error, as a
        request that could not start gets it (a 400, a 503 with Retry-After), else a 500; failed by an
        MCP server: the failed response, its error saying which and why)."""
        async def end(out: Events) -> Events:
            if turn.encoder.status == "failed" and not turn.encoder.failed_dependency:
                cause = turn.encoder.failure
                # a generation of an MCP loop opens inside the turn: its refusal is the request's
                raise cause if cause is not None and (cause.status < 500 or cause.status == 503) else internal_error()
            return out
        async for _ in self.events(turn, generation, end):
            pass
        return turn.encoder.response

    async def _store(self, turn: Turn) -> None:
        if not turn.req.should_store:
            return
        try:
            await self.state.put_response(turn.snapshot(turn.encoder.response))
        except StateError as e:
            raise store_error(e) from e

    # ---- POST /v1/responses ---------------------------------------------------------------------
    async def create(self, body: bytes, caller: Caller, guard: Guard = unguarded) -> dict[str, Any] | EventBatches:
        req = parse_response_request(body)
        identity = caller.identity
        turn = await self.prepare(req, caller, len(body))
        if req.background:
            try:
                response = await self._runs.start(turn)
            except BaseException as e:
                turn.ticket.settle(0)  # no run: its reservation goes back
                if isinstance(e, StateError):
                    raise store_error(e) from e
                raise
            return self.replay(identity, turn.encoder.id, -1) if req.stream else response
        generation = None if turn.runs_tools else await guard(self.open(turn))
        if req.stream:
            return self.stream(turn, generation)
        response = await guard(self._whole(turn, generation))
        await self._store(turn)  # not guarded: a client that leaves now does not lose what it made
        return response

    def replay(self, identity: str, response_id: str, after: int) -> EventBatches:
        """A background run's events after sequence number `after`, each once, to the terminal one."""
        return EventBatches(self._replay(identity, response_id, after))

    async def _replay(self, identity: str, response_id: str, after: int) -> AsyncIterator[Events]:
        """Ends with an `error` event if the log cannot be read to its end (the response deleted
        meanwhile: response_not_found), numbered after the last event sent, as an encoder numbers one."""
        try:
            async for event in self.state.read_events(identity, response_id, after=after + 1, follow=True):
                sent = replayed(event)
                yield [sent]
                after = sent["sequence_number"]
        except StateError as e:
            err = not_found(response_id) if isinstance(e, NotFound) else store_error(e)
            yield [error_event(err, after + 1)]

    # ---- GET / DELETE / cancel / input items ----------------------------------------------------
    async def _snapshot(self, identity: str, response_id: str) -> spb.StoredResponse:
        try:
            return await self.state.get_response(identity, response_id)
        except NotFound:
            raise not_found(response_id) from None
        except StateError as e:
            raise store_error(e) from e

    @staticmethod
    def current(snapshot: spb.StoredResponse) -> dict[str, Any]:
        """The response as it stands: a background run's status record is the authority until its
        final snapshot is written."""
        response = json.loads(snapshot.response_json)
        if snapshot.HasField("run") and snapshot.run.status:
            status = spb.RunStatus.Name(snapshot.run.status).removeprefix("RUN_STATUS_").lower()
            if status != response.get("status"):
                response["status"] = status
                if status == "failed" and not response.get("error"):
                    response["error"] = {"code": "server_error", "message": snapshot.run.detail or
                                         "The server running this response stopped."}
        return response

    async def retrieve(self, identity: str, response_id: str, *, stream: bool = False,
                       after: int = -1) -> dict[str, Any] | EventBatches:
        snapshot = await self._snapshot(identity, response_id)
        if not stream:
            return self.current(snapshot)
        if not snapshot.HasField("run"):
            raise OpenAIError(400, "Only background responses can be streamed again; this one was not "
                              "created with 'background': true.", param="stream")
        return self.replay(identity, response_id, after)

    async def delete(self, identity: str, response_id: str) -> dict[str, Any]:
        snapshot = await self._snapshot(identity, response_id)
        if snapshot.HasField("run") and snapshot.run.status in (spb.RUN_STATUS_QUEUED, spb.RUN_STATUS_IN_PROGRESS):
            await self._runs.abort(response_id, json.loads(snapshot.response_json).get("model", ""))
        try:
            if not await self.state.delete_response(identity, response_id):
                raise not_found(response_id)
        except StateError as e:
            raise store_error(e) from e
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, identity: str, response_id: str) -> dict[str, Any]:
        snapshot = await self._snapshot(identity, response_id)
        if not snapshot.HasField("run"):
            raise OpenAIError(400, "Only background responses can be cancelled.", param="response_id")
        response = self.current(snapshot)
        if response["status"] not in ("queued", "in_progress"):
            return response  # finished (or already cancelled): it stays as it is
        cancelled = {**response, "status": "cancelled", "completed_at": None}
        stored = spb.StoredResponse()
        stored.CopyFrom(snapshot)
        stored.ClearField("run")
        stored.response_json = json.dumps(cancelled)
        terminal = {"type": "response.incomplete", "sequence_number": 0, "response": cancelled}
        try:
            await self.state.cancel_run(identity, response_id, response=stored, event_json=json.dumps(terminal))
        except Conflict:  # it finished first: answer with what it finished as
            return self.current(await self._snapshot(identity, response_id))
        except StateError as e:
            raise store_error(e) from e
        await self._runs.abort(response_id, response.get("model", ""))
        return cancelled

    async def input_items(self, identity: str, response_id: str, *, limit: int = 20, order: str = "desc",
                          after: str = "") -> dict[str, Any]:
        if not 1 <= limit <= 100:
            raise OpenAIError(400, "'limit' must be between 1 and 100.", param="limit")
        if order not in ("asc", "desc"):
            raise OpenAIError(400, "'order' must be 'asc' or 'desc'.", param="order")
        try:
            page = await self.state.list_input_items(identity, response_id, limit=limit, order=order, after=after)
        except NotFound:
            raise not_found(response_id) from None
        except StateError as e:
            # a cursor naming no item of this response: the store's own reason says so (which id)
            cursor = dict(e.details.field_violations).get("after")
            if e.details.code == grpc.StatusCode.INVALID_ARGUMENT and cursor:
                raise OpenAIError(400, f"Invalid 'after': {cursor}.", param="after") from e
            raise store_error(e) from e
        return {"object": "list", "data": [json.loads(i.item_json) for i in page.data],
                "first_id": page.first_id or None, "last_id": page.last_id or None, "has_more": page.has_more}

    # ---- POST /v1/responses/compact -------------------------------------------------------------
    async def compact(self, body: bytes, caller: Caller, guard: Guard = unguarded) -> dict[str, Any]:
        """Summarise the conversation with the model itself; the output starts a new, shorter chain."""
        req = parse_compact_request(body)
        history = await load_history(self.state, caller.identity, req.previous_response_id)
        check_call_ids(history, req.input_items)
        conversation = [*history, *[item_dict(i) for i in self.codec.expand(req.input_items)]]
        summary_req = parse_response_request({"model": req.model, "store": False, "input": SUMMARY_PROMPT,
                                              "max_output_tokens": SUMMARY_MAX_TOKENS,
                                              "instructions": req.instructions})
        turn = await self.prepare(summary_req, caller, len(body), history=conversation)
        generation = await guard(self.open(turn))
        summary = await guard(self._whole(turn, generation))
        return self.codec.compacted(conversation, summary)
