"""`POST /v1/embeddings`: the request, its worker calls, the list of embeddings."""

from __future__ import annotations

import asyncio
from typing import Any

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.common.routes import RouteTable
from services.gateway.admission.admission import Admission
from services.gateway.edge.answer import Guard, unguarded
from services.gateway.embeddings.protocol import embedding_list, parse_embedding_request, to_embed_requests
from services.gateway.generation import check_routed, embed
from services.gateway.identity import Caller
from services.gateway.protocol_common.outputs import new_id


class EmbeddingServing:
    def __init__(self, table: RouteTable, timeout_s: float | None = None, admission: Admission | None = None) -> None:
        self.table, self.timeout_s = table, timeout_s
        self.admission = admission or Admission(table)

    async def create(self, body: bytes, caller: Caller, guard: Guard = unguarded) -> dict[str, Any]:
        # Embeddings keep no prefix cache: the caller counts for its rate limits only.
        req = parse_embedding_request(body)
        check_routed(self.table, req.model, common_pb2.USECASE_EMBED)
        route = self.table.routes.get(req.model)
        requests = to_embed_requests(req, request_id=new_id("embd"),
                                     dimension=route.embedding_dimension if route is not None else 0)
        ticket = await self.admission.admit(caller, req.model, prompt_bytes=len(body), max_tokens=0)
        replies: list[pb.EmbedResponse] = []
        try:
            replies = await guard(self._embed_all(req.model, requests, caller.identity))
        finally:
            ticket.settle(sum(r.usage.prompt_tokens for r in replies))
        return embedding_list(req, replies)

    async def _embed_all(self, model: str, requests: list[pb.EmbedRequest], identity: str) -> list[pb.EmbedResponse]:
        """The replies in request order; the calls run at once (spread over the replicas), and the
        first failure cancels the others."""
        def call(request: pb.EmbedRequest) -> Any:
            return embed(self.table, model, request, timeout_s=self.timeout_s, identity=identity)

        if len(requests) == 1:
            return [await call(requests[0])]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(call(r)) for r in requests]
        except ExceptionGroup as e:  # the first failure (an OpenAIError); the others were cancelled
            raise e.exceptions[0] from None
        return [t.result() for t in tasks]
