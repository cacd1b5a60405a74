"""The `mship.state.v1.State` servicer over a Store backend.

Committed model sets are served here; stored responses, run status and event logs are the
Responses API's (their RPCs answer UNIMPLEMENTED until that lands).
"""

from __future__ import annotations

import time

from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.errors import ServiceError, abort_with
from services.state.store import Store


class StateServicer(state_pb2_grpc.StateServicer):
    def __init__(self, store: Store) -> None:
        self.store = store

    async def PutModelSet(self, request: pb.PutModelSetRequest, context) -> pb.PutModelSetResponse:
        model_set = pb.ModelSet()
        model_set.CopyFrom(request.model_set)
        model_set.committed_at = model_set.committed_at or time.time()
        try:
            await self.store.put(f"modelsets/{model_set.gateway or 'default'}", model_set.SerializeToString())
        except ServiceError as e:
            await abort_with(context, e)
        return pb.PutModelSetResponse()

    async def GetModelSet(self, request: pb.GetModelSetRequest, context) -> pb.ModelSet:
        try:
            data = await self.store.get(f"modelsets/{request.gateway or 'default'}")
        except ServiceError as e:
            await abort_with(context, e)
        return pb.ModelSet.FromString(data) if data else pb.ModelSet(gateway=request.gateway)
