import grpc
import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import ServiceError
from services.worker.sampling import sampling_from_request

BAD = {
    "max_tokens": pb.SamplingParams(max_tokens=0),
    "temperature": pb.SamplingParams(temperature=-0.1),
    "top_p": pb.SamplingParams(top_p=0.0),
    "top_k": pb.SamplingParams(top_k=-2),
    "min_p": pb.SamplingParams(min_p=1.5),
    "presence_penalty": pb.SamplingParams(presence_penalty=2.5),
    "frequency_penalty": pb.SamplingParams(frequency_penalty=-3),
    "repetition_penalty": pb.SamplingParams(repetition_penalty=0),
    "stop": pb.SamplingParams(stop=["a", "b", "c", "d", "e"]),
    "min_tokens": pb.SamplingParams(max_tokens=2, min_tokens=3),
    "n": pb.SamplingParams(n=0),
    "top_logprobs": pb.SamplingParams(top_logprobs=3),
}


@pytest.mark.parametrize("field", list(BAD))
def test_bad_values_name_their_field(field):
    with pytest.raises(ServiceError) as info:
        sampling_from_request(pb.InferRequest(sampling=BAD[field]))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.field_violations[0][0] == field


def test_nan_temperature_is_refused():
    with pytest.raises(ServiceError):
        sampling_from_request(pb.InferRequest(sampling=pb.SamplingParams(temperature=float("nan"))))


def test_defaults_and_mapping():
    s = sampling_from_request(pb.InferRequest())
    assert (s.max_tokens, s.temperature, s.n, s.logprobs, s.skip_special_tokens) == (None, None, 1, None, True)
    s = sampling_from_request(pb.InferRequest(sampling=pb.SamplingParams(
        max_tokens=5, temperature=0, top_k=0, logprobs=True, top_logprobs=2, keep_special_tokens=True)))
    assert (s.max_tokens, s.temperature, s.top_k, s.logprobs, s.skip_special_tokens) == (5, 0.0, -1, 2, False)


def test_top_k_zero_is_off_not_unset():
    """top_k 0 asks for no top-k cut (vLLM: 0 or -1). It must not become "unset", which leaves the
    engine's default: llama-server's is top_k 40."""
    off = sampling_from_request(pb.InferRequest(sampling=pb.SamplingParams(top_k=0)))
    assert off.top_k == -1 and sampling_from_request(pb.InferRequest()).top_k is None


def test_response_formats():
    fmt = pb.ResponseFormat(json_schema=pb.JsonSchema(name="x", schema_json='{"type": "object"}'))
    assert sampling_from_request(pb.InferRequest(response_format=fmt)).json_schema == {"type": "object"}
    with pytest.raises(ServiceError) as info:
        sampling_from_request(pb.InferRequest(response_format=pb.ResponseFormat(
            json_schema=pb.JsonSchema(schema_json="{bad"))))
    assert info.value.field_violations[0][0] == "response_format.json_schema.schema"
    choice = pb.ResponseFormat(choice=pb.ChoiceList(choices=["yes", "no"]))
    assert sampling_from_request(pb.InferRequest(response_format=choice)).choice == ("yes", "no")
