"""`/v1/embeddings` end to end over real sockets (tests/unit/gateway_harness.py): the openai SDK and
httpx against the real app, routed to a real `WorkerServicer` around an embedding engine double,
next to a generation model; the usecase checks of every endpoint; the worker's refusals as 400s."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from collections.abc import AsyncIterator

import grpc
import httpx
import openai
import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.gateway.embeddings.protocol import MAX_INPUTS
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.unit.gateway_harness import SCRIPT, Gateway, hang_up, raw_post

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, client, oai
pytestmark = pytest.mark.timeout(60)

EMB, CHAT_MODEL, DIM, MAX_LEN = "emb", "m", 8, 16


def vector(item: str | list[int]) -> list[float]:
    """The double's embedding: a deterministic function of the input."""
    seed = sum(map(ord, item)) if isinstance(item, str) else sum(item) + 1000
    return [math.sin(seed + k) for k in range(DIM)]


class EmbeddingEngine(ScriptedEngine):
    """Embeds each input as `vector(input)`; one token per word (or per id). Like a model without
    Matryoshka support it refuses `dimensions`, and it refuses inputs longer than its context."""

    supports_embeddings = True
    embedding_dimension = DIM

    def __init__(self, dim: int = DIM) -> None:
        super().__init__([], max_model_len=MAX_LEN)
        self.embedding_dimension = dim
        self.embedded: list[list[str | list[int]]] = []

    async def embed(self, inputs, dimensions):
        self.embedded.append(list(inputs))
        try:
            await self.hold.wait()  # set unless a test parks the engine mid-batch
        except asyncio.CancelledError:
            self.cancelled.append(inputs[0])
            raise
        if dimensions is not None:
            raise invalid_parameter("dimensions", "this model cannot shorten its embeddings")
        counts = [len(x.split()) if isinstance(x, str) else len(x) for x in inputs]
        if max(counts) > MAX_LEN:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.CONTEXT_TOO_LONG, "input too long",
                               field_violations=[("input", "input is longer than the context")])
        if "broken" in inputs:  # a model whose numbers overflowed
            return [[math.nan if x == "broken" else 0.5] * DIM for x in inputs], sum(counts)
        if self.embedding_dimension != DIM:  # wide: one value per input, cheap to make at any size
            return [[float(sum(map(ord, x)))] * self.embedding_dimension for x in inputs], sum(counts)
        return [vector(x) for x in inputs], sum(counts)


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    """The fixtures' gateway, taking bodies the size of a full batch."""
    gw = Gateway(max_body_bytes=2**20)
    yield gw
    await gw.stop()


@pytest.fixture
def dim() -> int:
    """The embedding model's dimension (a test overrides it with `parametrize`)."""
    return DIM


@pytest.fixture
async def embedder(gateway: Gateway, dim: int) -> AsyncIterator[ServedWorker]:
    """EMB (usecase embed) on an embedding worker, CHAT_MODEL (generate) on a scripted one."""
    emb = await serve_worker(EmbeddingEngine(dim), name=EMB)
    chat = await serve_worker(ScriptedEngine(SCRIPT))
    gateway.version += 1
    snapshot = cpb.RoutingSnapshot(version=gateway.version)
    for name, worker, usecase in ((EMB, emb, common_pb2.USECASE_EMBED),
                                  (CHAT_MODEL, chat, common_pb2.USECASE_GENERATE)):
        model = snapshot.models.add(name=name, version="v1", max_model_len=MAX_LEN, usecase=usecase,
                                    embedding_dimension=dim if worker is emb else 0)
        replica = model.replicas.add(replica_id=f"{name}-r0", model=name, version="v1")
        replica.endpoint.host, replica.endpoint.port = "127.0.0.1", worker.port
    await gateway.on_loop(lambda: gateway.table.apply(snapshot))
    try:
        yield emb
        await until(lambda: gateway.http.inflight == 0, "the edge to finish its requests")
        await until(lambda: all(e.outstanding == 0 for r in gateway.table.routes.values() for e in r.endpoints),
                    "the picker's outstanding counts to return to 0")
    finally:
        emb.engine.hold.set()
        for w in (emb, chat):
            await w.server.stop(0)


def f32(values: list[float]) -> list[float]:
    """What a float32 wire carries back as Python floats."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


async def test_embeds_a_string_through_the_openai_sdk(embedder, oai: openai.AsyncOpenAI):
    out = await oai.embeddings.create(model=EMB, input="hello there world", encoding_format="float")
    assert (out.object, out.model, len(out.data)) == ("list", EMB, 1)
    item = out.data[0]
    assert (item.object, item.index, item.embedding) == ("embedding", 0, f32(vector("hello there world")))
    assert (out.usage.prompt_tokens, out.usage.total_tokens) == (3, 3)


async def test_the_sdks_default_base64_decodes_to_the_float_vector(embedder, oai: openai.AsyncOpenAI):
    floats = await oai.embeddings.create(model=EMB, input=["a", "b"], encoding_format="float")
    default = await oai.embeddings.create(model=EMB, input=["a", "b"])  # the SDK asks for base64, decodes it
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]


async def test_base64_over_raw_http_is_little_endian_float32(embedder, client: httpx.AsyncClient):
    r = await client.post("/v1/embeddings", json={"model": EMB, "input": "x", "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{DIM}f", raw)) == f32(vector("x"))


async def test_a_batch_keeps_input_order_in_one_worker_call(embedder, oai: openai.AsyncOpenAI):
    texts = ["one", "two words", "three more words"]
    out = await oai.embeddings.create(model=EMB, input=texts, encoding_format="float")
    assert [d.index for d in out.data] == [0, 1, 2]
    assert [d.embedding for d in out.data] == [f32(vector(t)) for t in texts]
    assert embedder.engine.embedded == [texts]
    assert out.usage.prompt_tokens == 6


async def test_token_ids_reach_the_engine_as_token_ids(embedder, oai: openai.AsyncOpenAI):
    one = await oai.embeddings.create(model=EMB, input=[5, 6, 7], encoding_format="float")
    many = await oai.embeddings.create(model=EMB, input=[[5, 6, 7], [8]], encoding_format="float")
    assert embedder.engine.embedded == [[[5, 6, 7]], [[5, 6, 7], [8]]]
    assert one.data[0].embedding == many.data[0].embedding == f32(vector([5, 6, 7]))
    assert many.data[1].embedding == f32(vector([8]))


async def refusal(client: httpx.AsyncClient, path: str, body: dict) -> dict:
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


async def test_dimensions_refused_by_the_model_names_dimensions(embedder, client: httpx.AsyncClient):
    error = await refusal(client, "/v1/embeddings", {"model": EMB, "input": "x", "dimensions": 4})
    assert error["param"] == "dimensions" and "shorten" in error["message"]


async def test_input_longer_than_the_context_names_input(embedder, client: httpx.AsyncClient):
    error = await refusal(client, "/v1/embeddings", {"model": EMB, "input": "w " * (MAX_LEN + 1)})
    assert (error["param"], error["code"]) == ("input", "context_length_exceeded")


@pytest.mark.parametrize("body", [{"input": ""}, {"input": []}, {"input": ["a", ""]}, {"input": [[]]}])
async def test_bad_input_is_refused_before_the_worker(embedder, client: httpx.AsyncClient, body):
    error = await refusal(client, "/v1/embeddings", {"model": EMB, **body})
    assert error["param"].startswith("input")
    assert embedder.engine.embedded == []


async def test_an_embedding_model_refuses_generation_endpoints(embedder, client: httpx.AsyncClient):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        error = await refusal(client, path, {"model": EMB, **body})
        assert error["param"] == "model" and "embedding model" in error["message"], error


async def test_a_generation_model_refuses_embeddings(embedder, oai: openai.AsyncOpenAI):
    with pytest.raises(openai.BadRequestError) as e:
        await oai.embeddings.create(model=CHAT_MODEL, input="hi")
    assert e.value.body["param"] == "model" and "does not support embeddings" in e.value.body["message"]


async def test_the_generation_model_still_chats(embedder, oai: openai.AsyncOpenAI):
    out = await oai.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "".join(SCRIPT)


async def test_an_unknown_model_is_a_404(embedder, oai: openai.AsyncOpenAI):
    with pytest.raises(openai.NotFoundError):
        await oai.embeddings.create(model="nope", input="hi")


async def test_models_show_the_embedding_dimension(gateway: Gateway, client: httpx.AsyncClient):
    gateway.version += 1
    snapshot = cpb.RoutingSnapshot(version=gateway.version)
    snapshot.models.add(name=EMB, version="v1", usecase=common_pb2.USECASE_EMBED, embedding_dimension=DIM)
    snapshot.models.add(name=CHAT_MODEL, version="v1", usecase=common_pb2.USECASE_GENERATE)
    await gateway.on_loop(lambda: gateway.table.apply(snapshot))
    cards = {c["id"]: c for c in (await client.get("/v1/models")).json()["data"]}
    assert cards[EMB]["embedding_dimension"] == DIM and "embedding_dimension" not in cards[CHAT_MODEL]
    assert (await client.get(f"/v1/models/{EMB}")).json()["embedding_dimension"] == DIM


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_a_nan_vector_is_a_500_in_either_encoding(embedder, client: httpx.AsyncClient, encoding_format):
    r = await client.post("/v1/embeddings", json={"model": EMB, "input": ["ok", "broken"],
                                                  "encoding_format": encoding_format})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text


WIDE = 8192  # e.g. a 70B GGUF mean-pooled by the llama_cpp loader: 2048 of its vectors pass 64 MiB


@pytest.mark.parametrize("dim", [WIDE])
async def test_a_full_batch_of_wide_vectors_is_answered_in_order(embedder, oai: openai.AsyncOpenAI):
    texts = [f"t{i}" for i in range(MAX_INPUTS)]
    out = await oai.embeddings.create(model=EMB, input=texts)  # base64, as the SDK asks by default
    assert [d.index for d in out.data] == list(range(MAX_INPUTS))
    assert all(d.embedding == [float(sum(map(ord, t)))] * WIDE for d, t in zip(out.data, texts, strict=True))
    assert out.usage.prompt_tokens == MAX_INPUTS
    batches = embedder.engine.embedded  # in the order the calls reached the engine
    assert sorted(t for batch in batches for t in batch) == sorted(texts) and len(batches) > 1


@pytest.mark.parametrize(("dim", "n"), [(DIM, 2), (WIDE, 1024)])  # one worker call; several
async def test_a_client_that_hangs_up_cancels_the_embedding(embedder, gateway: Gateway, n):
    embedder.engine.hold.clear()
    _, writer = await raw_post(gateway.http.port, "/v1/embeddings", {"model": EMB, "input": ["a"] * n})
    embedded = embedder.engine.embedded
    await until(lambda: sum(map(len, embedded)) == n, "every input to reach the engine")
    await hang_up(writer)
    await until(lambda: len(embedder.engine.cancelled) == len(embedded), "the engine's work to be cancelled")
