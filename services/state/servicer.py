"""The `mship.state.v1.State` servicer over a Store backend: request validation (INVALID_ARGUMENT
with field violations), then one store call; store errors travel as they are (NOT_FOUND,
ALREADY_EXISTS/ABORTED with CONFLICT, UNAVAILABLE/STORE_UNAVAILABLE). Handlers only raise
`ServiceError`; the server's `ErrorInterceptor` turns it into the call's status."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import TypeVar

import grpc

from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.errors import Reason, ServiceError
from services.state import runs
from services.state.store import Store

T = TypeVar("T")
MAX_KEY_PART = 512  # bytes of an identity or id: keys stay small
DEFAULT_PAGE, MAX_PAGE = 20, 100
DEFAULT_EXPIRE_LIMIT = 100
# The longest owner lease: a lease is how long a silent owner is trusted (the gateway renews a
# 10 s lease every 3 s), not a way to keep a run unfinished for good.
MAX_LEASE_S = 3600.0


def _bad(violations: list[tuple[str, str]]) -> None:
    if violations:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PARAMETER,
                           "; ".join(f"{f}: {d}" for f, d in violations), field_violations=violations)


def _key_violations(key: pb.ResponseKey, path: str) -> list[tuple[str, str]]:
    out = []
    for name in ("identity", "response_id"):
        value = getattr(key, name)
        if not value:
            out.append((f"{path}.{name}", "required"))
        elif len(value.encode()) > MAX_KEY_PART:
            out.append((f"{path}.{name}", f"at most {MAX_KEY_PART} bytes"))
    return out


def _key(key: pb.ResponseKey, path: str = "key") -> tuple[str, str]:
    _bad(_key_violations(key, path))
    return key.identity, key.response_id


def _snapshot_violations(response: pb.StoredResponse, path: str) -> list[tuple[str, str]]:
    out = _key_violations(response.key, f"{path}.key")
    seen: set[str] = set()
    for i, item in enumerate(response.input_items):
        if not item.id:
            out.append((f"{path}.input_items[{i}].id", "required (it is the pagination cursor)"))
        elif item.id in seen:
            out.append((f"{path}.input_items[{i}].id", f"duplicate id {item.id!r}"))
        seen.add(item.id)
    return out


def _status_violations(status: int, path: str, allowed: frozenset[int]) -> list[tuple[str, str]]:
    if status not in allowed:
        names = ", ".join(pb.RunStatus.Name(s) for s in sorted(allowed))
        return [(path, f"must be one of {names}")]
    return []


def _expected_violations(expected: list[int]) -> list[tuple[str, str]]:
    valid = runs.ACTIVE | runs.FINISHED
    return [(f"expected[{i}]", "not a run status") for i, s in enumerate(expected) if s not in valid]


def _lease_s_violations(lease_s: float, *, required: bool) -> list[tuple[str, str]]:
    """Finite, not negative (positive where required), at most MAX_LEASE_S. NaN compares false
    with every lease end: a NaN lease would never expire, and neither would an infinite one."""
    if not math.isfinite(lease_s):
        return [("lease_s", f"must be a finite number of seconds, not {lease_s!r}")]
    if lease_s < 0 or (required and lease_s == 0):
        return [("lease_s", "must be positive" if required else "must not be negative")]
    if lease_s > MAX_LEASE_S:
        return [("lease_s", f"must be at most {MAX_LEASE_S:g} seconds")]
    return []


def _found(value: T | None, identity: str, response_id: str) -> T:
    """`value`, or NOT_FOUND (the same answer for another identity's id as for no id at all)."""
    if value is None:
        raise runs.not_found(identity, response_id)
    return value


def page_items(items: list[pb.InputItem], limit: int, order: int, after: str) -> pb.ListInputItemsResponse:
    """One page of input items, the way the API pages lists (`after` is exclusive)."""
    ordered = list(reversed(items)) if order != pb.LIST_ORDER_ASC else list(items)
    start = 0
    if after:
        ids = [item.id for item in ordered]
        if after not in ids:
            _bad([("after", f"no input item {after!r} in this response")])
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return pb.ListInputItemsResponse(data=page, first_id=page[0].id if page else "",
                                     last_id=page[-1].id if page else "", has_more=start + limit < len(ordered))


class StateServicer(state_pb2_grpc.StateServicer):
    def __init__(self, store: Store) -> None:
        self.store = store

    # ---- stored responses ----
    async def PutResponse(self, request: pb.PutResponseRequest, context) -> pb.PutResponseResponse:
        _bad(_snapshot_violations(request.response, "response"))
        await self.store.put_response(request.response, create_only=request.create_only)
        return pb.PutResponseResponse()

    async def GetResponse(self, request: pb.GetResponseRequest, context) -> pb.StoredResponse:
        identity, response_id = _key(request.key)
        return _found(await self.store.get_response(identity, response_id), identity, response_id)

    async def DeleteResponse(self, request: pb.DeleteResponseRequest, context) -> pb.DeleteResponseResponse:
        deleted = await self.store.delete_response(*_key(request.key))
        return pb.DeleteResponseResponse(deleted=deleted)

    async def ListInputItems(self, request: pb.ListInputItemsRequest, context) -> pb.ListInputItemsResponse:
        violations = _key_violations(request.key, "key")
        if request.limit > MAX_PAGE:
            violations.append(("limit", f"must be between 1 and {MAX_PAGE}"))
        if request.order not in pb.ListOrder.values():
            violations.append(("order", "must be asc or desc"))
        _bad(violations)
        identity, response_id = request.key.identity, request.key.response_id
        response = _found(await self.store.get_response(identity, response_id), identity, response_id)
        return page_items(list(response.input_items), request.limit or DEFAULT_PAGE, request.order,
                          request.after)

    # ---- runs ----
    async def CreateRun(self, request: pb.CreateRunRequest, context) -> pb.RunStatusRecord:
        violations = _snapshot_violations(request.response, "response")
        violations += _status_violations(request.status or pb.RUN_STATUS_QUEUED, "status", runs.ACTIVE)
        violations += self._lease_violations(request.owner, request.lease_s, required=False)
        _bad(violations)
        return await self.store.create_run(request.response, request.status or pb.RUN_STATUS_QUEUED,
                                           request.owner, request.lease_s, request.failure_event_json)

    async def SetRunStatus(self, request: pb.SetRunStatusRequest, context) -> pb.RunStatusRecord:
        violations = _key_violations(request.key, "key")
        violations += _status_violations(request.status, "status", runs.ACTIVE | runs.FINISHED)
        violations += _expected_violations(list(request.expected))
        violations += _lease_s_violations(request.lease_s, required=False)
        _bad(violations)
        return await self.store.set_run_status(request.key.identity, request.key.response_id, request.status,
                                               request.expected, request.owner, request.lease_s)

    async def GetRunStatus(self, request: pb.GetRunStatusRequest, context) -> pb.RunStatusRecord:
        identity, response_id = _key(request.key)
        return _found(await self.store.get_run(identity, response_id), identity, response_id)

    async def RenewRun(self, request: pb.RenewRunRequest, context) -> pb.RunStatusRecord:
        _bad(_key_violations(request.key, "key") + self._lease_violations(request.owner, request.lease_s,
                                                                           required=True))
        return await self.store.renew_run(request.key.identity, request.key.response_id, request.owner,
                                          request.lease_s)

    async def FinishRun(self, request: pb.FinishRunRequest, context) -> pb.RunStatusRecord:
        violations = _key_violations(request.key, "key")
        violations += _status_violations(request.status, "status", runs.FINISHED)
        violations += _expected_violations(list(request.expected))
        violations += runs.validate_events(request.events, "events", allow_terminal=True)
        response = None
        if request.HasField("response"):
            response = pb.StoredResponse()
            response.CopyFrom(request.response)
            response.key.CopyFrom(request.key)  # the snapshot is the run's, whatever it says
            violations += _snapshot_violations(response, "response")
        _bad(violations)
        return await self.store.finish_run(request.key.identity, request.key.response_id, request.status,
                                           request.expected, request.owner, response, request.events)

    async def ExpireRuns(self, request: pb.ExpireRunsRequest, context) -> pb.ExpireRunsResponse:
        failed = await self.store.expire_runs(request.limit or DEFAULT_EXPIRE_LIMIT)
        return pb.ExpireRunsResponse(failed=failed)

    @staticmethod
    def _lease_violations(owner: str, lease_s: float, *, required: bool) -> list[tuple[str, str]]:
        out = _lease_s_violations(lease_s, required=required)
        if (required or lease_s > 0) and not owner:
            out.append(("owner", "required with a lease"))
        return out

    # ---- event logs ----
    async def AppendEvents(self, request: pb.AppendEventsRequest, context) -> pb.AppendEventsResponse:
        violations = _key_violations(request.key, "key")
        if not request.events:
            violations.append(("events", "at least one event"))
        violations += runs.validate_events(request.events, "events", allow_terminal=False)
        _bad(violations)
        last = await self.store.append_events(request.key.identity, request.key.response_id, request.events,
                                              request.owner)
        return pb.AppendEventsResponse(last_sequence=last)

    async def ReadEvents(self, request: pb.ReadEventsRequest, context) -> AsyncIterator[pb.RunEvent]:
        identity, response_id = _key(request.key)
        async for event in self.store.read_events(identity, response_id, request.after_sequence,
                                                  request.follow):
            yield event

    # ---- committed model sets ----
    async def PutModelSet(self, request: pb.PutModelSetRequest, context) -> pb.PutModelSetResponse:
        model_set = pb.ModelSet()
        model_set.CopyFrom(request.model_set)
        model_set.committed_at = model_set.committed_at or time.time()
        await self.store.put(f"modelsets/{model_set.gateway or 'default'}", model_set.SerializeToString())
        return pb.PutModelSetResponse()

    async def GetModelSet(self, request: pb.GetModelSetRequest, context) -> pb.ModelSet:
        data = await self.store.get(f"modelsets/{request.gateway or 'default'}")
        return pb.ModelSet.FromString(data) if data else pb.ModelSet(gateway=request.gateway)
