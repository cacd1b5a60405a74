"""`/v1/embeddings` on real vLLM: builtin:all-minilm-l6-v2 in a worker process (`--embed`), behind the
real edge in this process (tests/unit/gateway_harness.py), routed by a snapshot the real replica
registry makes from what the worker reports; asserted with the openai SDK."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import openai
import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from tests.unit.gateway_harness import Gateway
from tests.worker_process import WorkerProcess

pytestmark = pytest.mark.integration
MINILM, CHAT, DIM = "minilm", "chat", 384


@pytest.fixture(scope="module")
def minilm_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = WorkerProcess.start("builtin:all-minilm-l6-v2", Path(tmp_path_factory.mktemp("minilm")) / "worker.log",
                                 name=MINILM, extra=["--embed"])
    try:
        worker.wait_serving()
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="module")
async def edge(minilm_worker: WorkerProcess) -> AsyncIterator[Gateway]:
    """The edge routing MINILM (embed) to the worker and CHAT (generate, no replica needed: the
    usecase check refuses first) through the registry's snapshot."""
    async with grpc.aio.insecure_channel(minilm_worker.address) as channel:
        report = await worker_pb2_grpc.WorkerStub(channel).GetLoad(pb.GetLoadRequest())
    registry = ReplicaRegistry()
    await registry.set_active(MINILM, ActiveModel("v1", common_pb2.USECASE_EMBED))
    await registry.set_active(CHAT, ActiveModel("v1", common_pb2.USECASE_GENERATE))
    host, port = minilm_worker.address.rsplit(":", 1)
    await registry.register(cpb.ReplicaInfo(  # what the worker deployment registers
        replica_id="r0", model=MINILM, version="v1", endpoint=common_pb2.Endpoint(host=host, port=int(port)),
        max_model_len=report.max_model_len, embedding_dimension=report.embedding_dimension))
    await registry.register(cpb.ReplicaInfo(replica_id="c0", model=CHAT, version="v1",
                                            endpoint=common_pb2.Endpoint(host="127.0.0.1", port=1)))
    snapshot = registry.snapshot()
    gateway = Gateway(max_body_bytes=2**20)
    await gateway.on_loop(lambda: gateway.table.apply(snapshot))
    yield gateway
    await gateway.stop()


@pytest.fixture
async def oai(edge: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{edge.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


async def emb(oai: openai.AsyncOpenAI, value, **kw) -> list[list[float]]:
    out = await oai.embeddings.create(model=MINILM, input=value, encoding_format="float", **kw)
    return [d.embedding for d in out.data]


def close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def test_a_string_gets_one_384_dim_normalised_vector(oai):
    out = await oai.embeddings.create(model=MINILM, input="The quick brown fox", encoding_format="float")
    assert (out.object, out.model, [d.index for d in out.data]) == ("list", MINILM, [0])
    vector = out.data[0].embedding
    assert len(vector) == DIM
    assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-3)  # sentence-transformers' Normalize
    assert out.usage.prompt_tokens == out.usage.total_tokens == 6  # [CLS] the quick brown fox [SEP]


async def test_the_same_input_twice_gives_the_same_vector(oai):
    assert close((await emb(oai, "determinism"))[0], (await emb(oai, "determinism"))[0])


async def test_float_and_base64_are_the_same_vector(oai):
    floats = (await emb(oai, "encodings"))[0]
    raw = await oai.embeddings.create(model=MINILM, input="encodings", encoding_format="base64")
    data = base64.b64decode(raw.data[0].embedding)  # the SDK hands an explicit base64 back as is
    assert list(struct.unpack(f"<{DIM}f", data)) == floats
    default = await oai.embeddings.create(model=MINILM, input="encodings")  # the SDK asks base64, decodes it
    assert default.data[0].embedding == floats


async def test_a_batch_keeps_input_order(oai):
    a, b = await emb(oai, ["a", "b"])
    assert close(a, (await emb(oai, "a"))[0]) and close(b, (await emb(oai, "b"))[0])
    assert not close(a, b)


async def test_the_vectors_mean_something(oai):
    cat, kitten, stocks = await emb(oai, ["A cat sits on the mat.", "A kitten is resting on a rug.",
                                          "Stock markets fell sharply today."])
    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.2


async def test_token_ids_embed_like_their_text(oai, minilm_worker):
    from tokenizers import Tokenizer

    from services.worker.builtin import resolve_model_ref
    tokenizer = Tokenizer.from_file(str(Path(resolve_model_ref("builtin:all-minilm-l6-v2")) / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads to 128 for sentence-transformers' batches
    ids = tokenizer.encode("hello world").ids
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]: the tokenizer's special tokens are part of them
    text = (await emb(oai, "hello world"))[0]
    assert close((await emb(oai, ids))[0], text)
    assert close((await emb(oai, [ids, ids[:2]]))[0], text)


async def test_models_show_the_dimension(oai, edge):
    assert edge.table.routes[MINILM].usecase == common_pb2.USECASE_EMBED
    card = await oai.models.retrieve(MINILM)
    assert card.model_extra["embedding_dimension"] == DIM


async def bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        await call
    assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error"
    return e.value.body


async def test_dimensions_are_refused_by_a_model_without_matryoshka(oai):
    body = await bad_request(oai.embeddings.create(model=MINILM, input="x", dimensions=128))
    assert body["param"] == "dimensions" and "Matryoshka" in body["message"]


async def test_input_longer_than_the_context_is_refused(oai):
    body = await bad_request(oai.embeddings.create(model=MINILM, input="word " * 600))
    assert (body["param"], body["code"]) == ("input", "context_length_exceeded")


@pytest.mark.parametrize("value", ["", [], ["ok", ""], [[]]])
async def test_empty_input_is_refused(oai, value):
    body = await bad_request(oai.embeddings.create(model=MINILM, input=value))
    assert body["param"].startswith("input")


async def test_too_many_inputs_are_refused(oai):
    body = await bad_request(oai.embeddings.create(model=MINILM, input=["x"] * 2049))
    assert body["param"] == "input" and "2048" in body["message"]


async def test_generation_requests_to_the_embedding_model_are_refused(oai):
    chat = await bad_request(oai.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}]))
    completion = await bad_request(oai.completions.create(model=MINILM, prompt="hi"))
    assert chat["param"] == completion["param"] == "model"


async def test_embeddings_of_a_generation_model_are_refused(oai):
    body = await bad_request(oai.embeddings.create(model=CHAT, input="hi"))
    assert body["param"] == "model" and "does not support embeddings" in body["message"]
