"""`/v1/embeddings` wire models: the four `input` shapes, OpenAI-style 400s, the worker request, and
the response object (float and base64 encodings of the same float32 vector)."""

from __future__ import annotations

import base64
import struct

import pytest

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.embeddings.protocol import (
    CALL_BYTES,
    MAX_INPUTS,
    embedding_list,
    encode_vector,
    parse_embedding_request,
    to_embed_request,
    to_embed_requests,
)
from services.gateway.protocol_common.openai_error import OpenAIError
from tests.helpers import refused

M = "emb"


def req(**kw):
    return parse_embedding_request({"model": M, "input": "hello", **kw})


@pytest.mark.parametrize(("value", "inputs"), [
    ("hello", ["hello"]),
    (["a", "b c"], ["a", "b c"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_input_shapes(value, inputs):
    assert req(input=value).inputs == inputs


def test_defaults_and_optional_fields():
    r = req(encoding_format="base64", dimensions=64, user="u-1")
    assert (r.encoding_format, r.dimensions) == ("base64", 64)
    assert (req().encoding_format, req().dimensions) == (None, None)


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": ""}, "input", "empty string"),
    ({"input": ["a", ""]}, "input[1]", "empty string"),
    ({"input": []}, "input", "empty array"),
    ({"input": [[]]}, "input[0]", "empty array"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, "input", f"maximum length {MAX_INPUTS}"),
    ({"input": [[1]] * (MAX_INPUTS + 1)}, "input", f"maximum length {MAX_INPUTS}"),
    ({"input": ["a", 1]}, "input[1]", "expected a string"),
    ({"input": [1, "a"]}, "input[1]", "expected an integer"),
    ({"input": [-1]}, "input[0]", "below minimum"),
    ({"input": 5}, "input", "expected a string, an array of strings"),
    ({"input": None}, "input", "but got null"),
    ({"input": {"text": "a"}}, "input", "but got an object"),
    ({"encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
    ({"dimensions": 0}, "dimensions", "below minimum"),
    ({"dimensions": "8"}, "dimensions", "expected an integer"),
    ({"truncate": True}, "truncate", "Unrecognized request argument"),
])
def test_bad_requests_are_400s_naming_the_field(body, param, words):
    err = refused(parse_embedding_request, {"model": M, "input": "hello", **body})
    assert err.param == param, err
    assert words in err.message, err


def test_missing_model_and_input():
    assert refused(parse_embedding_request, {"input": "x"}).param == "model"
    err = refused(parse_embedding_request, {"model": M})
    assert (err.param, err.message) == ("input", "Missing required parameter: 'input'.")
    assert refused(parse_embedding_request, b"{not json").code == "invalid_json"


def test_worker_request_for_texts_and_token_ids():
    texts = to_embed_request(req(input=["a", "b"], dimensions=8), request_id="r1")
    assert (list(texts.inputs), list(texts.prompts), texts.request_id, texts.model) == (["a", "b"], [], "r1", M)
    assert texts.HasField("dimensions") and texts.dimensions == 8
    tokens = to_embed_request(req(input=[[1, 2], [3]]), request_id="r2")
    assert list(tokens.inputs) == [] and [list(p.token_ids) for p in tokens.prompts] == [[1, 2], [3]]
    assert not tokens.HasField("dimensions")
    one = to_embed_request(req(input=[7, 8]), request_id="r3")
    assert [list(p.token_ids) for p in one.prompts] == [[7, 8]]


def reply(*vectors: list[float], tokens: int = 5) -> pb.EmbedResponse:
    return pb.EmbedResponse(embeddings=[pb.Embedding(values=v) for v in vectors],
                            usage=common_pb2.Usage(prompt_tokens=tokens))


VECTORS = ([0.1, -0.25, 3.3e-5], [1.0 / 3, 2.0, -7.75])


def test_float_response_in_input_order():
    body = embedding_list(req(input=["a", "b"]), [reply(*VECTORS)])
    assert body["object"] == "list" and body["model"] == M
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    f32 = [list(e.values) for e in reply(*VECTORS).embeddings]  # the float32 values the worker sent
    assert [d["embedding"] for d in body["data"]] == f32
    assert body["data"][0]["embedding"] == pytest.approx(VECTORS[0], rel=1e-6)


def test_base64_is_the_little_endian_float32_bytes_of_the_float_vector():
    floats = embedding_list(req(input=["a", "b"]), [reply(*VECTORS)])
    b64 = embedding_list(req(input=["a", "b"], encoding_format="base64"), [reply(*VECTORS)])
    for f, b in zip(floats["data"], b64["data"], strict=True):
        raw = base64.b64decode(b["embedding"])
        assert len(raw) == 4 * len(f["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == f["embedding"]  # exactly equal
    assert encode_vector([1.0], "base64") == base64.b64encode(b"\x00\x00\x80\x3f").decode()


def test_a_worker_answer_with_the_wrong_count_is_a_500_not_a_wrong_answer():
    with pytest.raises(OpenAIError) as e:
        embedding_list(req(input=["a", "b"]), [reply(VECTORS[0])])
    assert e.value.status == 500


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_a_vector_with_nan_or_infinity_is_a_500_in_either_encoding(bad, encoding_format):
    with pytest.raises(OpenAIError) as e:
        embedding_list(req(input=["a"], encoding_format=encoding_format), [reply([0.5, bad, 1.0])])
    assert e.value.status == 500


def test_replies_of_several_calls_join_in_input_order():
    body = embedding_list(req(input=["a", "b", "c"]), [reply(VECTORS[0], tokens=2), reply(VECTORS[1], [2.0], tokens=3)])
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert body["data"][2]["embedding"] == [2.0] and body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


def test_a_small_batch_is_one_call_under_the_request_id():
    calls = to_embed_requests(req(input=["a"] * MAX_INPUTS, dimensions=64), request_id="r", dimension=1024)
    assert [(c.request_id, len(c.inputs), c.dimensions) for c in calls] == [("r", MAX_INPUTS, 64)]


@pytest.mark.parametrize(("value", "dimension", "dimensions"), [
    (["a"] * MAX_INPUTS, 8192, None),  # the replies: 2048 x 32 KiB
    (["a"] * MAX_INPUTS, 0, None),  # a route that does not say: assumed wide
    (["a"] * MAX_INPUTS, 16384, 8192),  # shortened: the shorter vectors count
    (["x" * 40_000] * 1000, 8, None),  # the requests: 40 MB of text
    ([[7] * 10_000] * 1000, 8, None),  # 10M token ids
])
def test_a_big_batch_is_split_into_calls_under_the_message_limit(value, dimension, dimensions):
    r = req(input=value, dimensions=dimensions)
    calls = to_embed_requests(r, request_id="r", dimension=dimension)
    assert len(calls) > 1 and len({c.request_id for c in calls}) == len(calls)
    assert [x for c in calls for x in [*c.inputs, *(list(p.token_ids) for p in c.prompts)]] == r.inputs
    width = min(dimensions or 8192, dimension or 8192)
    for c in calls:
        n = len(c.inputs) + len(c.prompts)
        assert c.ByteSize() + n * (4 * width + 16) <= CALL_BYTES
        assert c.dimensions == (dimensions or 0) and c.HasField("dimensions") == (dimensions is not None)


def test_one_input_bigger_than_a_call_is_a_call_of_its_own():
    calls = to_embed_requests(req(input=["a", "x" * CALL_BYTES, "b"]), request_id="r", dimension=8)
    assert [len(c.inputs[0]) for c in calls] == [1, CALL_BYTES, 1]
