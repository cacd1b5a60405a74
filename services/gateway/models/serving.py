"""`/v1/models`: the models this gateway routes to now."""

from __future__ import annotations

from typing import Any

from services.common.routes import RouteTable
from services.gateway.models.protocol import model_card, model_list
from services.gateway.protocol_common.openai_error import model_not_found


class ModelsServing:
    def __init__(self, table: RouteTable, created: int) -> None:
        self.table, self.created = table, created

    def list(self) -> dict[str, Any]:
        return model_list(((name, r.embedding_dimension) for name, r in self.table.routes.items()), self.created)

    def get(self, model_id: str) -> dict[str, Any]:
        route = self.table.routes.get(model_id)
        if route is None:
            raise model_not_found(model_id)
        return model_card(model_id, self.created, route.embedding_dimension)
