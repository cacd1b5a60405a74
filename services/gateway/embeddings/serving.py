"""`POST /v1/embeddings`: the request, its worker call, the list of embeddings."""

from __future__ import annotations

from typing import Any

from mship.common.v1 import common_pb2
from services.common.routes import RouteTable
from services.gateway.admission.admission import Admission
from services.gateway.edge.answer import Guard, unguarded
from services.gateway.embeddings.protocol import embedding_list, parse_embedding_request, to_embed_request
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
        request = to_embed_request(req, request_id=new_id("embd"))
        ticket = await self.admission.admit(caller, req.model, prompt_bytes=len(body), max_tokens=0)
        return embedding_list(req, await guard(embed(self.table, req.model, request, timeout_s=self.timeout_s,
                                                     ticket=ticket, identity=caller.identity)))
