"""`/v1/responses`: create (foreground, streamed or not, or background), retrieve, resume,
delete, cancel, input items, compaction. Stored responses are scoped by caller identity."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from mship.state.v1 import state_pb2 as spb
from services.common.infer import UpstreamError, open_infer
from services.common.routes import RouteTable
from services.gateway.background import BackgroundRuns, RunSpec, replayed
from services.gateway.conversation import CompactionCodec, item_dict, load_history, snapshot_of, store_error
from services.gateway.disconnect import ClientDisconnected, unless_disconnected
from services.gateway.errors import OpenAIError, from_grpc, internal_error
from services.gateway.identity import cache_salt_for, identity_of
from services.gateway.protocol import SSE_DONE
from services.gateway.protocol.responses import ResponseRequest, parse_compact_request, parse_response_request
from services.gateway.protocol.responses import to_infer_request as infer_request
from services.gateway.protocol.responses_events import ResponseStreamEncoder, new_item_id, sse_response_event
from services.gateway.protocol.responses_items import to_messages
from services.gateway.serving import CLIENT_CLOSED, check_routed
from services.state.client import Conflict, NotFound, StateClient, StateError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SUMMARY_PROMPT = "Summarize the conversation so far in a few sentences, keeping every fact needed to continue it."


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", param="response_id",
                       code="response_not_found")


@dataclass
class Turn:
    """One prepared turn: the request, its conversation so far and the worker request."""

    req: ResponseRequest
    identity: str
    history: list[dict[str, Any]]
    inputs: list[dict[str, Any]]
    encoder: ResponseStreamEncoder

    def snapshot(self, response: dict[str, Any]) -> spb.StoredResponse:
        return snapshot_of(self.identity, response, self.history, self.inputs, self.req.previous_response_id)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        return [*self.history, *self.inputs, *self.encoder.response["output"]]


class ResponsesAPI:
    def __init__(self, table: RouteTable, state: StateClient, owner: str, codec: CompactionCodec) -> None:
        self.table, self.state, self.codec = table, state, codec
        self.runs = BackgroundRuns(table, state, owner)

    # ---- preparing a turn (everything that can be refused is refused here, before engine work) ----
    async def prepare(self, req: ResponseRequest, identity: str, history: list[dict[str, Any]] | None = None,
                      ) -> tuple[Turn, Any]:
        check_routed(self.table, req.model)
        if history is None:
            history = await load_history(self.state, identity, req.previous_response_id)
        inputs = self.codec.expand(req.input_items)
        messages = to_messages(req.instructions, history, inputs)
        encoder = ResponseStreamEncoder.for_request(req)
        infer = infer_request(req, messages, request_id=encoder.id, cache_salt=cache_salt_for(identity))
        return Turn(req, identity, history, [item_dict(i) for i in inputs], encoder), infer

    async def _store(self, turn: Turn) -> None:
        if not turn.req.should_store:
            return
        try:
            await self.state.put_response(turn.snapshot(turn.encoder.response))
        except StateError as e:
            raise store_error(e) from e

    # ---- POST /v1/responses ---------------------------------------------------------------------
    async def create(self, http: Request) -> Response:
        req = parse_response_request(await http.body())
        identity = identity_of(http)
        turn, infer = await self.prepare(req, identity)
        if req.background:
            try:
                response = await self.runs.start(RunSpec(identity, req.model, infer, turn.encoder, turn.snapshot))
            except StateError as e:
                raise store_error(e) from e
            if req.stream:
                return StreamingResponse(self._replay(identity, turn.encoder.id, -1), media_type="text/event-stream",
                                         headers=SSE_HEADERS)
            return JSONResponse(response)
        try:
            stream = await unless_disconnected(http, open_infer(self.table, req.model, infer))
        except UpstreamError as e:
            raise from_grpc(e.details, req.model, input_param="input") from e
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        if req.stream:
            return StreamingResponse(self._stream(turn, stream), media_type="text/event-stream", headers=SSE_HEADERS)
        try:
            await unless_disconnected(http, self._drain(turn, stream))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        if turn.encoder.status == "failed":
            raise internal_error()
        await self._store(turn)
        return JSONResponse(turn.encoder.response)

    async def _drain(self, turn: Turn, stream) -> None:
        try:
            async for event in stream:
                turn.encoder.encode(event)
        except UpstreamError as e:
            turn.encoder.fail(from_grpc(e.details, turn.req.model, input_param="input"))
        finally:
            stream.close()
        turn.encoder.fail()  # no-op after a Final

    async def events(self, turn: Turn, stream) -> AsyncIterator[dict[str, Any]]:
        """The turn's events; the snapshot is stored before the terminal event goes out, so a
        client that saw `response.completed` can always continue from it."""
        encoder = turn.encoder
        for event in encoder.start():
            yield event
        try:
            async for worker_event in stream:
                out = encoder.encode(worker_event)
                if encoder.done:
                    break
                for event in out:
                    yield event
            else:
                out = encoder.fail()  # ended without a Final
        except UpstreamError as e:
            err = from_grpc(e.details, turn.req.model, input_param="input")
            out = [encoder.error_event(err), *encoder.fail(err)]
        finally:
            stream.close()
        if encoder.status != "failed":
            try:
                await self._store(turn)
            except OpenAIError as e:
                out = [*out[:-1], encoder.error_event(e)]
        for event in out:
            yield event

    async def _stream(self, turn: Turn, stream) -> AsyncIterator[bytes]:
        async for event in self.events(turn, stream):
            yield sse_response_event(event)
        yield SSE_DONE

    async def _replay(self, identity: str, response_id: str, after: int) -> AsyncIterator[bytes]:
        """A background run's events after sequence number `after`, each once, to the terminal one."""
        try:
            async for event in self.state.read_events(identity, response_id, after=after + 1, follow=True):
                yield sse_response_event(replayed(event))
        except StateError as e:
            yield sse_response_event({"type": "error", "sequence_number": after, "code": "store_unavailable",
                                      "message": str(store_error(e))})
        yield SSE_DONE

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

    async def retrieve(self, http: Request, response_id: str) -> Response:
        identity = identity_of(http)
        snapshot = await self._snapshot(identity, response_id)
        if http.query_params.get("stream") in ("true", "1"):
            if not snapshot.HasField("run"):
                raise OpenAIError(400, "Only background responses can be streamed again; this one was not "
                                  "created with 'background': true.", param="stream")
            after = _int_param(http, "starting_after", -1)
            return StreamingResponse(self._replay(identity, response_id, after), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return JSONResponse(self.current(snapshot))

    async def delete(self, http: Request, response_id: str) -> Response:
        identity = identity_of(http)
        snapshot = await self._snapshot(identity, response_id)
        if snapshot.HasField("run") and snapshot.run.status in (spb.RUN_STATUS_QUEUED, spb.RUN_STATUS_IN_PROGRESS):
            await self.runs.abort(response_id, json.loads(snapshot.response_json).get("model", ""))
        try:
            if not await self.state.delete_response(identity, response_id):
                raise not_found(response_id)
        except StateError as e:
            raise store_error(e) from e
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def cancel(self, http: Request, response_id: str) -> Response:
        identity = identity_of(http)
        snapshot = await self._snapshot(identity, response_id)
        if not snapshot.HasField("run"):
            raise OpenAIError(400, "Only background responses can be cancelled.", param="response_id")
        response = self.current(snapshot)
        if response["status"] not in ("queued", "in_progress"):
            return JSONResponse(response)  # finished (or already cancelled): it stays as it is
        cancelled = {**response, "status": "cancelled", "completed_at": None}
        stored = spb.StoredResponse()
        stored.CopyFrom(snapshot)
        stored.ClearField("run")
        stored.response_json = json.dumps(cancelled)
        terminal = {"type": "response.incomplete", "sequence_number": 0, "response": cancelled}
        try:
            await self.state.cancel_run(identity, response_id, response=stored, event_json=json.dumps(terminal))
        except Conflict:  # it finished first: answer with what it finished as
            return JSONResponse(self.current(await self._snapshot(identity, response_id)))
        except StateError as e:
            raise store_error(e) from e
        await self.runs.abort(response_id, response.get("model", ""))
        return JSONResponse(cancelled)

    async def input_items(self, http: Request, response_id: str) -> Response:
        identity = identity_of(http)
        limit = _int_param(http, "limit", 20)
        order = http.query_params.get("order", "desc")
        if not 1 <= limit <= 100:
            raise OpenAIError(400, "'limit' must be between 1 and 100.", param="limit")
        if order not in ("asc", "desc"):
            raise OpenAIError(400, "'order' must be 'asc' or 'desc'.", param="order")
        try:
            page = await self.state.list_input_items(identity, response_id, limit=limit, order=order,
                                                     after=http.query_params.get("after", ""))
        except NotFound:
            raise not_found(response_id) from None
        except StateError as e:
            raise store_error(e) from e
        return JSONResponse({"object": "list", "data": [json.loads(i.item_json) for i in page.data],
                             "first_id": page.first_id or None, "last_id": page.last_id or None,
                             "has_more": page.has_more})

    # ---- POST /v1/responses/compact -------------------------------------------------------------
    async def compact(self, http: Request) -> Response:
        """Summarise the conversation with the model itself; the output (the user's messages kept
        verbatim, then a sealed compaction item carrying the summary) starts a new, shorter chain."""
        req = parse_compact_request(await http.body())
        identity = identity_of(http)
        history = await load_history(self.state, identity, req.previous_response_id)
        conversation = [*history, *[item_dict(i) for i in self.codec.expand(req.input_items)]]
        summary_req = parse_response_request({"model": req.model, "store": False, "max_output_tokens": 256,
                                              "input": SUMMARY_PROMPT, "instructions": req.instructions})
        turn, infer = await self.prepare(summary_req, identity, history=conversation)
        try:
            stream = await unless_disconnected(http, open_infer(self.table, req.model, infer))
            await unless_disconnected(http, self._drain(turn, stream))
        except UpstreamError as e:
            raise from_grpc(e.details, req.model, input_param="input") from e
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        if turn.encoder.status == "failed":
            raise internal_error()
        summary = "".join(part.get("text", "") for item in turn.encoder.response["output"]
                          if item.get("type") == "message" for part in item.get("content", []))
        kept = [i for i in conversation if i.get("type") == "message" and i.get("role") == "user"]
        sealed = self.codec.seal([{"type": "message", "role": "developer",
                                   "content": f"Summary of the conversation so far: {summary}"}])
        return JSONResponse({"id": new_item_id("resp"), "object": "response.compaction",
                             "created_at": int(time.time()), "usage": turn.encoder.response["usage"],
                             "output": [*kept, {"type": "compaction", "id": new_item_id("cmp"),
                                                "encrypted_content": sealed}]})


def _int_param(http: Request, name: str, default: int) -> int:
    value = http.query_params.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise OpenAIError(400, f"'{name}' must be an integer.", param=name) from None
