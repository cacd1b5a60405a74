"""`POST /v1/embeddings`: the request, its worker call, the list of embeddings."""

from __future__ import annotations

from typing import Any

from mship.common.v1 import common_pb2
from services.common.routes import RouteTable
from services.gateway.edge.answer import Guard, unguarded
from services.gateway.embeddings.protocol import embedding_list, parse_embedding_request, to_embed_request
from services.gateway.generation import check_routed, embed
from services.gateway.protocol_common.outputs import new_id


class EmbeddingServing:
    def __init__(self, table: RouteTable, timeout_s: float | None = None) -> None:
        self.table, self.timeout_s = table, timeout_s

    async def create(self, body: bytes, identity: str, guard: Guard = unguarded) -> dict[str, Any]:
        # `identity` is unused: embeddings keep no prefix cache to isolate between callers.
        req = parse_embedding_request(body)
        check_routed(self.table, req.model, common_pb2.USECASE_EMBED)
        request = to_embed_request(req, request_id=new_id("embd"))
        return embedding_list(req, await guard(embed(self.table, req.model, request, timeout_s=self.timeout_s)))
