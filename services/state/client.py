"""A small async client of the state service for the other services."""

from __future__ import annotations

import grpc

from mship.common.v1 import common_pb2
from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc


class StateClient:
    def __init__(self, address: str, gateway: str = "default") -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self.stub = state_pb2_grpc.StateStub(self._channel)
        self.gateway = gateway

    async def put_model_set(self, models: list[common_pb2.ModelSpec], deploy_id: str) -> None:
        await self.stub.PutModelSet(pb.PutModelSetRequest(model_set=pb.ModelSet(
            gateway=self.gateway, models=models, deploy_id=deploy_id)), timeout=10)

    async def get_model_set(self, timeout_s: float = 10.0) -> list[common_pb2.ModelSpec]:
        reply = await self.stub.GetModelSet(pb.GetModelSetRequest(gateway=self.gateway), timeout=timeout_s,
                                            wait_for_ready=True)
        return list(reply.models)

    async def close(self) -> None:
        await self._channel.close()
