"""`/v1/completions`: request validation and conversion, and the `text_completion` objects (whole and
streamed) built from scripted worker events, checked against the `openai` package's types."""

from __future__ import annotations

import openai
import openai.types
import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.completions.protocol import (
    CompletionAssembler,
    CompletionStreamEncoder,
    parse_completion_request,
)
from services.gateway.protocol_common.openai_error import OpenAIError
from tests.helpers import refused
from tests.unit.chat_requests import completion_infer
from tests.unit.worker_events import LENGTH, STOP, TEXT, TOOLS, delta, final, lp

# ---- requests --------------------------------------------------------------------------------

def test_unknown_completion_field():
    err = refused(parse_completion_request, {"model": "m", "prompt": "x", "messages": []})
    assert err.param == "messages"


def test_completion_prompt_forms():
    assert completion_infer().prompt == pb.PromptInput(text="Once")
    assert completion_infer(prompt=["Once"]).prompt == pb.PromptInput(text="Once")
    assert completion_infer(prompt=[1, 2, 3]).prompt == pb.PromptInput(token_ids=[1, 2, 3])
    assert completion_infer(prompt=[[4, 5]]).prompt == pb.PromptInput(token_ids=[4, 5])
    req = completion_infer(max_tokens=5, logprobs=2, temperature=0, echo=False, best_of=1, stop=["\n"])
    assert (req.sampling.max_tokens, req.sampling.top_logprobs, req.sampling.logprobs) == (5, 2, True)
    assert not req.parse_reasoning and req.cache_salt == ""
    assert not completion_infer(logprobs=None).sampling.logprobs


@pytest.mark.parametrize(("extra", "param"), [
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt[1]"),
    ({"prompt": [-1]}, "prompt[0]"),
    ({"prompt": [True]}, "prompt[0]"),
    ({"suffix": "tail"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"prompt": [1, 2], "echo": True}, "echo"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"temperature": 3}, "temperature"),
    ({"logit_bias": {"1": 1}}, "logit_bias"),
])
def test_completion_refusals(extra, param):
    assert refused(parse_completion_request, {"model": "m", "prompt": "x", **extra}).param == param


def test_completion_best_of_equal_to_n_is_fine():
    assert completion_infer(n=2, best_of=2).sampling.n == 2


# ---- responses ----------------------------------------------------------------------------





def test_completion_text_and_usage():
    asm = CompletionAssembler("tiny", completion_id="cmpl-1", created=5)
    for event in TEXT:
        asm.add(event)
    parsed = openai.types.Completion.model_validate(asm.result())
    assert (parsed.id, parsed.object, parsed.model) == ("cmpl-1", "text_completion", "tiny")
    assert (parsed.choices[0].text, parsed.choices[0].finish_reason, parsed.choices[0].logprobs) == (
        "Hello, world", "stop", None)
    assert parsed.usage.total_tokens == 12


def test_completion_echo_n2_logprobs():
    req = parse_completion_request({"model": "tiny", "prompt": "Say:", "echo": True, "n": 2})
    asm = CompletionAssembler.for_request(req)
    for event in [delta(" hi", index=0), delta(" yo", index=1), final(STOP, LENGTH)]:
        asm.add(event)
    parsed = openai.types.Completion.model_validate(asm.result())
    assert [(c.text, c.finish_reason) for c in parsed.choices] == [("Say: hi", "stop"), ("Say: yo", "length")]

    asm = CompletionAssembler("tiny", logprobs=True)
    for event in [delta("Hi", logprobs=[lp("Hi", -0.1, ("Yo", -2.0))]), delta(" there", logprobs=[lp(" there", -0.2)]),
                  final(STOP)]:
        asm.add(event)
    logprobs = openai.types.Completion.model_validate(asm.result()).choices[0].logprobs
    assert logprobs.tokens == ["Hi", " there"] and logprobs.text_offset == [0, 2]
    assert logprobs.token_logprobs == [pytest.approx(-0.1), pytest.approx(-0.2)]
    assert logprobs.top_logprobs[0] == {"Yo": -2.0, "Hi": pytest.approx(-0.1)}  # the sampled token is included


def test_completion_tool_calls_finish_is_stop_and_error_raises():
    asm = CompletionAssembler("tiny")
    asm.add(final(TOOLS))
    assert asm.result()["choices"][0]["finish_reason"] == "stop"
    asm = CompletionAssembler("tiny")
    asm.add(final(pb.FINISH_REASON_ERROR))
    with pytest.raises(OpenAIError):
        asm.result()


def test_completion_stream():
    req = parse_completion_request({"model": "tiny", "prompt": "Say:", "echo": True, "stream": True,
                                    "stream_options": {"include_usage": True}})
    enc = CompletionStreamEncoder.for_request(req, completion_id="cmpl-s", created=1)
    chunks = [c for event in [delta(" hi"), delta("!"), final(STOP)] for c in enc.encode(event)]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Say: hi", "!", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "stop"]
    assert all(c["usage"] is None and (c["id"], c["object"]) == ("cmpl-s", "text_completion") for c in chunks[:-1])
    openai.types.Completion.model_validate(chunks[-2])  # the closing chunk is a complete Completion
    last = openai.types.Completion.model_validate(chunks[-1])
    assert last.choices == [] and last.usage.total_tokens == 12
    for c in chunks[:-2]:  # mid-stream chunks carry finish_reason null, as OpenAI streams them
        openai.types.Completion.model_validate({**c, "choices": [{**c["choices"][0], "finish_reason": "stop"}]})


def test_completion_stream_logprobs_offsets_continue():
    enc = CompletionStreamEncoder("tiny", logprobs=True)
    first = enc.encode(delta("ab", logprobs=[lp("a", -1.0), lp("b", -1.0)]))[0]
    second = enc.encode(delta("c", logprobs=[lp("c", -1.0)]))[0]
    assert first["choices"][0]["logprobs"]["text_offset"] == [0, 1]
    assert second["choices"][0]["logprobs"]["text_offset"] == [2]
    assert "usage" not in first
