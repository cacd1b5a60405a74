"""An embedding model's dimension travels worker -> registry -> routing snapshot -> `/v1/models`; and
every endpoint's usecase check (`generation.check_routed`)."""

from __future__ import annotations

import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common.routes import RouteTable
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from services.gateway.generation import check_routed
from services.gateway.models.protocol import model_card, model_list
from services.gateway.models.serving import ModelsServing
from services.gateway.protocol_common.openai_error import OpenAIError

EMBED, GENERATE = common_pb2.USECASE_EMBED, common_pb2.USECASE_GENERATE


async def test_the_snapshot_carries_the_replicas_embedding_dimension():
    registry = ReplicaRegistry()
    await registry.set_active("emb", ActiveModel("v1", EMBED))
    await registry.set_active("chat", ActiveModel("v1", GENERATE))
    await registry.register(cpb.ReplicaInfo(replica_id="e0", model="emb", version="v1", embedding_dimension=384))
    await registry.register(cpb.ReplicaInfo(replica_id="c0", model="chat", version="v1"))
    routes = {m.name: m for m in registry.snapshot().models}
    assert (routes["emb"].embedding_dimension, routes["emb"].usecase) == (384, EMBED)
    assert routes["chat"].embedding_dimension == 0


def test_model_cards_show_the_dimension_of_embedding_models_only():
    assert model_card("emb", 7, 384) == {"id": "emb", "object": "model", "created": 7, "owned_by": "mship",
                                         "embedding_dimension": 384}
    assert "embedding_dimension" not in model_card("chat", 7)
    listed = model_list([("emb", 384), ("chat", 0)], 7)["data"]
    assert [(c["id"], c.get("embedding_dimension")) for c in listed] == [("chat", None), ("emb", 384)]


async def routed(*models: tuple[str, int]) -> RouteTable:
    table = RouteTable()
    snapshot = cpb.RoutingSnapshot(version=1)
    for name, usecase in models:
        snapshot.models.add(name=name, version="v1", usecase=usecase, embedding_dimension=384 * (usecase == EMBED))
    table.apply(snapshot)
    return table


async def test_models_serving_reads_the_routes_dimension():
    table = await routed(("emb", EMBED), ("chat", GENERATE))
    table.routes["emb"].embedding_dimension = 384  # what RouteTable.apply copies from the snapshot's route
    serving = ModelsServing(table, 7)
    assert serving.get("emb")["embedding_dimension"] == 384
    assert "embedding_dimension" not in serving.get("chat")
    assert [c["id"] for c in serving.list()["data"]] == ["chat", "emb"]


@pytest.mark.parametrize(("model", "usecase", "words"), [
    ("emb", GENERATE, "is an embedding model"),  # chat, completions, responses
    ("chat", EMBED, "does not support embeddings"),
    ("old", EMBED, "does not support embeddings"),  # usecase unset: a generation model
])
async def test_an_endpoint_of_another_usecase_is_a_400_naming_model(model, usecase, words):
    table = await routed(("emb", EMBED), ("chat", GENERATE), ("old", common_pb2.USECASE_UNSPECIFIED))
    with pytest.raises(OpenAIError) as e:
        check_routed(table, model, usecase)
    assert (e.value.status, e.value.param) == (400, "model") and words in e.value.message


async def test_matching_usecases_pass():
    table = await routed(("emb", EMBED), ("chat", GENERATE), ("old", common_pb2.USECASE_UNSPECIFIED))
    check_routed(table, "emb", EMBED)
    check_routed(table, "chat")
    check_routed(table, "old")
