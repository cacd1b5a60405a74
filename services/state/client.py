"""A small async client of the state service for the other services.

The Responses helpers raise `StateError` subclasses (NotFound, Conflict, Unavailable); each
carries the call's ErrorDetails, so the gateway maps it like any gRPC error
(services.gateway.edge.upstream.from_grpc).
The model-set helpers keep raising grpc.aio.AioRpcError, as before.

How the gateway drives a background run (see state.proto):
  create_run(snapshot, owner=replica, lease_s)        -> QUEUED, answered at once
  set_run_status(IN_PROGRESS, expected=[QUEUED])       when the engine starts
  append_events(...) / renew_run(...) while it runs    (Conflict from renew: cancelled -> stop)
  finish_run(COMPLETED, owner=replica, response=final, events=[..., terminal])
  cancel from any replica: finish_run(CANCELLED, response=..., events=[terminal with sequence 0])
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Sequence

import grpc

from mship.common.v1 import common_pb2
from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.channels import aio_channel
from services.common.errors import ErrorDetails
from services.common.logs import outgoing_metadata

ACTIVE = (pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_IN_PROGRESS)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# How long a call that found the service (or its store) unavailable makes `known_down` say so.
DOWN_FOR_S = 1.0


class StateError(Exception):
    def __init__(self, details: ErrorDetails) -> None:
        super().__init__(details.message)
        self.details = details

    @staticmethod
    def of(err: grpc.aio.AioRpcError) -> StateError:
        details = ErrorDetails.from_rpc_error(err)
        # A deadline is an outage too: the service bounds its own store calls well within it, so
        # a call that ran out of time found the service (or its host) hung.
        cls = {grpc.StatusCode.NOT_FOUND: NotFound, grpc.StatusCode.ABORTED: Conflict,
               grpc.StatusCode.ALREADY_EXISTS: AlreadyExists, grpc.StatusCode.UNAVAILABLE: Unavailable,
               grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
               }.get(details.code, StateError)
        return cls(details)


class NotFound(StateError):
    """No such response/run for this identity (or another identity's)."""


class AlreadyExists(StateError):
    """create_only / create_run on an id that is taken."""


class Unavailable(StateError):
    """The state store (or service) cannot be reached, or did not answer within the deadline:
    answer 503 before any engine work."""


class Conflict(StateError):
    """A compare-and-set lost; `status`, `owner` and `last_sequence` say where the run is now."""

    @property
    def status(self) -> int:
        return pb.RunStatus.Value(self.details.metadata.get("status", "RUN_STATUS_UNSPECIFIED"))

    @property
    def owner(self) -> str:
        return self.details.metadata.get("owner", "")

    @property
    def last_sequence(self) -> int:
        return int(self.details.metadata.get("last_sequence", "0"))


def key(identity: str, response_id: str) -> pb.ResponseKey:
    return pb.ResponseKey(identity=identity, response_id=response_id)


class StateClient:
    def __init__(self, address: str, gateway: str = "default", timeout_s: float = 10.0) -> None:
        self._channel = aio_channel(address, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC's default backoff grows to 120 s: after a restart of the state service its
            # clients would keep answering 503 long after it is back. Reconnect within a second.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
        self.stub = state_pb2_grpc.StateStub(self._channel)
        self.gateway = gateway
        self.timeout_s = timeout_s
        self._down_at = -DOWN_FOR_S  # monotonic time of the last call that found it unavailable

    def known_down(self) -> bool:
        """What this client already knows, at no cost (no call): the last call, under DOWN_FOR_S ago,
        found the service or its store unavailable, or the channel cannot connect (TRANSIENT_FAILURE:
        it keeps reconnecting, every second at most, and leaves that state once the service is back).
        False when it does not know (an idle channel, a call that succeeded since)."""
        if time.monotonic() - self._down_at < DOWN_FOR_S:
            return True
        # try_to_connect: an idle channel (e.g. the service went away) starts finding out now
        return self._channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.TRANSIENT_FAILURE

    def _answered(self) -> None:
        self._down_at = -DOWN_FOR_S

    def _failed(self, err: grpc.aio.AioRpcError) -> StateError:
        error = StateError.of(err)
        if isinstance(error, Unavailable):
            self._down_at = time.monotonic()
        elif error.details.code != grpc.StatusCode.CANCELLED:  # cancelled here: it says nothing
            self._answered()
        return error

    async def put_model_set(self, models: list[common_pb2.ModelSpec], deploy_id: str) -> None:
        await self.stub.PutModelSet(pb.PutModelSetRequest(model_set=pb.ModelSet(
            gateway=self.gateway, models=models, deploy_id=deploy_id)), timeout=10)

    async def get_model_set(self, timeout_s: float = 10.0) -> list[common_pb2.ModelSpec] | None:
        """The committed model set; None where none is stored (never committed, or the store lost
        it), which is not an empty set: deploying it would remove every model."""
        reply = await self.stub.GetModelSet(pb.GetModelSetRequest(gateway=self.gateway), timeout=timeout_s,
                                            wait_for_ready=True)
        return list(reply.models) if reply.committed_at else None

    async def close(self) -> None:
        await self._channel.close()

    async def _unary(self, method, request):
        try:
            reply = await method(request, timeout=self.timeout_s, metadata=outgoing_metadata() or None)
        except grpc.aio.AioRpcError as e:
            raise self._failed(e) from e
        self._answered()
        return reply

    # ---- stored responses ----
    async def put_response(self, response: pb.StoredResponse, create_only: bool = False) -> None:
        await self._unary(self.stub.PutResponse, pb.PutResponseRequest(response=response, create_only=create_only))

    async def get_response(self, identity: str, response_id: str) -> pb.StoredResponse:
        """The snapshot (with `run` for a background run); NotFound for unknown or another identity's."""
        return await self._unary(self.stub.GetResponse, pb.GetResponseRequest(key=key(identity, response_id)))

    async def delete_response(self, identity: str, response_id: str) -> bool:
        reply = await self._unary(self.stub.DeleteResponse, pb.DeleteResponseRequest(key=key(identity, response_id)))
        return reply.deleted

    async def list_input_items(self, identity: str, response_id: str, limit: int = 20, order: str = "desc",
                               after: str = "") -> pb.ListInputItemsResponse:
        return await self._unary(self.stub.ListInputItems, pb.ListInputItemsRequest(
            key=key(identity, response_id), limit=limit, after=after,
            order=pb.LIST_ORDER_ASC if order == "asc" else pb.LIST_ORDER_DESC))

    # ---- background runs ----
    async def create_run(self, response: pb.StoredResponse, owner: str, lease_s: float,
                         status: int = pb.RUN_STATUS_QUEUED, failure_event_json: str = "") -> pb.RunStatusRecord:
        return await self._unary(self.stub.CreateRun, pb.CreateRunRequest(
            response=response, status=status, owner=owner, lease_s=lease_s, failure_event_json=failure_event_json))

    async def get_run_status(self, identity: str, response_id: str) -> pb.RunStatusRecord:
        return await self._unary(self.stub.GetRunStatus, pb.GetRunStatusRequest(key=key(identity, response_id)))

    async def set_run_status(self, identity: str, response_id: str, status: int, expected: Iterable[int] = (),
                             owner: str = "", lease_s: float = 0.0) -> pb.RunStatusRecord:
        """Compare-and-set; Conflict (with the current status) when it lost."""
        return await self._unary(self.stub.SetRunStatus, pb.SetRunStatusRequest(
            key=key(identity, response_id), status=status, expected=list(expected), owner=owner, lease_s=lease_s))

    async def renew_run(self, identity: str, response_id: str, owner: str, lease_s: float) -> pb.RunStatusRecord:
        """The owner's heartbeat. Conflict once the run is finished (cancelled: stop the engine)."""
        return await self._unary(self.stub.RenewRun, pb.RenewRunRequest(
            key=key(identity, response_id), owner=owner, lease_s=lease_s))

    async def finish_run(self, identity: str, response_id: str, status: int, *, expected: Iterable[int] = ACTIVE,
                         owner: str = "", response: pb.StoredResponse | None = None,
                         events: Sequence[pb.RunEvent] = ()) -> pb.RunStatusRecord:
        """Final snapshot + status + last events in one transaction; Conflict if the run already
        finished (e.g. a cancel won): then nothing of this call was written."""
        return await self._unary(self.stub.FinishRun, pb.FinishRunRequest(
            key=key(identity, response_id), status=status, expected=list(expected), owner=owner, response=response,
            events=list(events)))

    async def cancel_run(self, identity: str, response_id: str, response: pb.StoredResponse | None = None,
                         event_json: str = "") -> pb.RunStatusRecord:
        """Cancel an unfinished run from any replica (with a terminal event if event_json is given).
        Conflict if it already finished: the caller answers with the finished response."""
        events = [pb.RunEvent(event_json=event_json, terminal=True)] if event_json else []
        return await self.finish_run(identity, response_id, pb.RUN_STATUS_CANCELLED, response=response,
                                     events=events)

    async def expire_runs(self, limit: int = 100) -> list[pb.RunStatusRecord]:
        return list((await self._unary(self.stub.ExpireRuns, pb.ExpireRunsRequest(limit=limit))).failed)

    # ---- event logs ----
    async def append_events(self, identity: str, response_id: str, events: Sequence[pb.RunEvent],
                            owner: str = "") -> int:
        """Append events numbered from the log's last + 1; returns the new last sequence.
        A retry of an append that did land gets Conflict with last_sequence >= its last event's:
        nothing was duplicated, the writer carries on from there."""
        reply = await self._unary(self.stub.AppendEvents, pb.AppendEventsRequest(
            key=key(identity, response_id), events=list(events), owner=owner))
        return reply.last_sequence

    async def read_events(self, identity: str, response_id: str, after: int = 0,
                          follow: bool = False) -> AsyncIterator[pb.RunEvent]:
        """Every event after `after`, once; with follow, waits for more through the terminal one."""
        call = self.stub.ReadEvents(pb.ReadEventsRequest(key=key(identity, response_id), after_sequence=after,
                                                         follow=follow))
        try:
            async for event in call:
                self._answered()
                yield event
        except grpc.aio.AioRpcError as e:
            raise self._failed(e) from e
        finally:
            call.cancel()
