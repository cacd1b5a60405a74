"""OpenAI error bodies, the gRPC -> HTTP table, validation errors and the FastAPI handlers."""

from __future__ import annotations

import grpc
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, ValidationError

from services.common.errors import ErrorDetails, Reason, ServiceError, invalid_parameter
from services.gateway.chat.protocol import ChatCompletionRequest
from services.gateway.edge.errors import install_handlers
from services.gateway.edge.upstream import from_grpc
from services.gateway.protocol_common.openai_error import (
    OpenAIError,
    body_too_large,
    invalid_json,
    model_not_found,
    overloaded,
    unavailable,
)
from services.gateway.protocol_common.validation import from_validation, param_path

C = grpc.StatusCode


def details(code: grpc.StatusCode, reason: str = "", message: str = "boom", *,
            violations: list[tuple[str, str]] | None = None, retry: float | None = None) -> ErrorDetails:
    return ErrorDetails(code=code, message=message, reason=reason, field_violations=violations or [],
                        retry_after_s=retry)


# (details, status, type, code, param, Retry-After)
TABLE = [
    (details(C.INVALID_ARGUMENT, "INVALID_PARAMETER", "temperature must be in [0, 2]",
             violations=[("temperature", "x"), ("top_p", "y")]), 400, "invalid_request_error", "invalid_value",
     "temperature", None),
    (details(C.INVALID_ARGUMENT, "CONTEXT_TOO_LONG", violations=[("messages", "too long")]), 400,
     "invalid_request_error", "context_length_exceeded", "messages", None),
    (details(C.INVALID_ARGUMENT, "UNSUPPORTED_INPUT", violations=[("messages[0].content[1]", "image")]), 400,
     "invalid_request_error", "unsupported_input", "messages[0].content[1]", None),
    (details(C.INVALID_ARGUMENT), 400, "invalid_request_error", None, None, None),
    (details(C.OUT_OF_RANGE), 400, "invalid_request_error", None, None, None),
    (details(C.FAILED_PRECONDITION, "INVALID_PARAMETER"), 400, "invalid_request_error", "invalid_value", None, None),
    (details(C.NOT_FOUND, "MODEL_NOT_FOUND"), 404, "invalid_request_error", "model_not_found", "model", None),
    (details(C.NOT_FOUND), 404, "invalid_request_error", "model_not_found", "model", None),
    (details(C.NOT_FOUND, "NOT_FOUND", "no such response"), 404, "invalid_request_error", "not_found", None, None),
    (details(C.RESOURCE_EXHAUSTED, "OVERLOADED", retry=2.2), 503, "server_error", "overloaded", None, "3"),
    # gRPC's own RESOURCE_EXHAUSTED (no reason): the request is past the message limit
    (details(C.RESOURCE_EXHAUSTED), 413, "invalid_request_error", "request_too_large", "messages", None),
    (details(C.UNAVAILABLE, "ENGINE_DIED", retry=2.0), 503, "server_error", "service_unavailable", None, "2"),
    (details(C.UNAVAILABLE, "NOT_READY", retry=0.5), 503, "server_error", "model_not_ready", None, "1"),
    (details(C.UNAVAILABLE, retry=4), 503, "server_error", "service_unavailable", None, "4"),
    (details(C.UNAVAILABLE, "STORE_UNAVAILABLE"), 503, "server_error", "service_unavailable", None, "1"),
    (details(C.DEADLINE_EXCEEDED), 504, "server_error", "timeout", None, None),
    (details(C.CANCELLED, "ERROR_REASON_UNSPECIFIED"), 499, "invalid_request_error", "request_cancelled", None, None),
    # No reason: gRPC ended the call (the replica stopping, its channel closed), not the client.
    (details(C.CANCELLED), 503, "server_error", "service_unavailable", None, "1"),
    (details(C.UNAUTHENTICATED), 401, "authentication_error", None, None, None),
    (details(C.PERMISSION_DENIED), 403, "permission_error", None, None, None),
    (details(C.ABORTED, "CONFLICT"), 409, "conflict_error", None, None, None),
    (details(C.INTERNAL, "ENGINE_ERROR", "engine error: OOM at 0xdeadbeef"), 500, "server_error", None, None, None),
    (details(C.UNKNOWN), 500, "server_error", None, None, None),
    (details(C.DATA_LOSS), 500, "server_error", None, None, None),
    (details(C.UNIMPLEMENTED), 501, "server_error", None, None, None),
]


@pytest.mark.parametrize(("d", "status", "type_", "code", "param", "retry_after"), TABLE,
                         ids=[f"{row[0].code.name}-{row[0].reason or 'none'}" for row in TABLE])
def test_grpc_to_http_table(d, status, type_, code, param, retry_after):
    err = from_grpc(d, "tiny")
    assert (err.status, err.type, err.code, err.param) == (status, type_, code, param)
    assert err.headers.get("Retry-After") == retry_after
    assert err.body() == {"error": {"message": err.message, "type": type_, "param": param, "code": code}}
    if status >= 500:
        assert "0xdeadbeef" not in err.message  # internals stay in the logs


def test_model_not_found_names_the_model():
    err = from_grpc(details(C.NOT_FOUND, "MODEL_NOT_FOUND"), "gpt-x")
    assert err.message.startswith("The model 'gpt-x' does not exist")


def test_bad_input_is_never_500():
    for code in (C.INVALID_ARGUMENT, C.OUT_OF_RANGE, C.FAILED_PRECONDITION):
        for reason in ("", "INVALID_PARAMETER", "CONTEXT_TOO_LONG", "UNSUPPORTED_INPUT"):
            assert from_grpc(details(code, reason), "m").status == 400


def test_context_too_long_on_completions_names_prompt():
    err = from_grpc(details(C.INVALID_ARGUMENT, "CONTEXT_TOO_LONG", "maximum context length is 64 tokens"), "m",
                    input_param="prompt")
    assert (err.param, err.code, err.message) == ("prompt", "context_length_exceeded",
                                                  "maximum context length is 64 tokens")


@pytest.mark.parametrize(("worker", "message", "param", "said"), [
    ("messages", "messages must not be empty", "input", "input must not be empty"),
    ("messages[2].content[0]", "image input", "input", "image input"),
    ("prompt", "the prompt is empty", "input", "the prompt is empty"),
    ("max_tokens", "max_tokens must be at least 1, got 0", "max_output_tokens",
     "max_output_tokens must be at least 1, got 0"),
    ("response_format.json_schema.schema", "schema must be a JSON object", "text.format.schema",
     "schema must be a JSON object"),
    ("tools[0].function.parameters", "not valid JSON", "tools", "not valid JSON"),
    ("temperature", "temperature must be in [0, 2]", "temperature", "temperature must be in [0, 2]"),
    # Embeddings and speech pass input_param="input" too: their own fields are none of the above.
    ("response_format", "'flac' audio cannot be encoded", "response_format", "'flac' audio cannot be encoded"),
    ("voice", "unknown voice", "voice", "unknown voice"),
    ("dimensions", "dimensions must be >= 1", "dimensions", "dimensions must be >= 1"),
])
def test_worker_field_names_read_as_responses_names(worker, message, param, said):
    """`input_param="input"`: the worker's chat field names (and a message that starts with one) as
    the Responses API names the field."""
    refusal = details(C.INVALID_ARGUMENT, "INVALID_PARAMETER", message, violations=[(worker, message)])
    err = from_grpc(refusal, "m", input_param="input")
    assert (err.status, err.param, err.message, err.code) == (400, param, said, "invalid_value")
    chat = from_grpc(refusal, "m", input_param="messages")  # chat keeps the worker's names
    assert (chat.param, chat.message) == (worker, message)


class FakeRpcError(grpc.RpcError):
    """What a failed grpc.aio call raises: code, details and the status-details trailer."""

    def __init__(self, err: ServiceError) -> None:
        self.status = err.to_status()

    def code(self) -> grpc.StatusCode:
        return self.status.code

    def details(self) -> str:
        return self.status.details

    def trailing_metadata(self):
        return self.status.trailing_metadata


def test_from_a_real_service_error():
    err = from_grpc(ErrorDetails.from_rpc_error(FakeRpcError(invalid_parameter("top_p", "top_p must be in (0, 1]"))),
                    "m")
    assert (err.status, err.param, err.message) == (400, "top_p", "top_p must be in (0, 1]")
    busy = ServiceError(C.RESOURCE_EXHAUSTED, Reason.OVERLOADED, "busy", retry_after_s=1.5)
    err = from_grpc(ErrorDetails.from_rpc_error(FakeRpcError(busy)), "m")
    assert (err.status, err.headers) == (503, {"Retry-After": "2"})


def test_helpers():
    assert invalid_json().status == 400 and invalid_json().code == "invalid_json"
    big = body_too_large(1024)
    assert big.status == 413 and "1024" in big.message
    assert model_not_found("x").body()["error"] == {
        "message": "The model 'x' does not exist or you do not have access to it.", "type": "invalid_request_error",
        "param": "model", "code": "model_not_found"}
    assert (overloaded(0.1).status, overloaded(0.1).headers) == (503, {"Retry-After": "1"})
    assert (unavailable(7).status, unavailable(7).headers) == (503, {"Retry-After": "7"})
    assert overloaded().headers == {"Retry-After": "1"}


def test_param_path():
    assert param_path(("body", "messages", 0, "content")) == "messages[0].content"
    assert param_path(("messages", 0, "<user>", "content", "<list>", 1, "<text>", "text")) == \
        "messages[0].content[1].text"
    assert param_path(("body",)) is None and param_path(()) is None


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    temperature: float = 1.0
    items: list[int] = []


def test_from_pydantic_validation_error():
    with pytest.raises(ValidationError) as e:
        Body.model_validate({"model": "m", "items": [1, "x"]})
    err = from_validation(e.value)
    assert (err.status, err.param) == (400, "items[1]")
    assert err.message == "Invalid type for 'items[1]': expected an integer, but got a string instead."


# ---- FastAPI handlers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    install_handlers(app)

    @app.post("/typed")
    async def typed(body: Body) -> dict:
        return {"ok": body.model}

    @app.post("/chat")
    async def chat(req: ChatCompletionRequest) -> dict:
        return {"messages": len(req.messages)}

    @app.post("/busy")
    async def busy() -> dict:
        raise overloaded(2.5)

    @app.post("/crash")
    async def crash() -> dict:
        raise RuntimeError("secret internals /etc/passwd")

    return TestClient(app, raise_server_exceptions=False)


def test_handler_openai_error_with_headers(client):
    r = client.post("/busy")
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["code"] == "overloaded"


def test_handler_request_validation(client):
    r = client.post("/typed", json={"model": "m", "temperature": "hot"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"
    r = client.post("/typed", json={"model": "m", "foo": 1})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Unrecognized request argument supplied: foo"
    r = client.post("/typed", content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_handler_catch_all_hides_the_traceback(client):
    r = client.post("/crash")
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "The server had an error while processing your request. Sorry about "
                                             "that!", "type": "server_error", "param": None, "code": None}}
    assert "passwd" not in r.text and "Traceback" not in r.text


def test_handler_unknown_route_is_an_openai_body(client):
    r = client.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


def test_openai_error_is_an_exception_with_a_body():
    err = OpenAIError(400, "bad", param="x", code="c", headers={"X": "1"})
    assert str(err) == "bad" and err.body() == {"error": {"message": "bad", "type": "invalid_request_error",
                                                          "param": "x", "code": "c"}}


def test_handler_with_the_chat_model_as_a_body_param(client):
    """Routes may take the wire model as a FastAPI body; errors still name the field path."""
    ok = client.post("/chat", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert ok.status_code == 200 and ok.json() == {"messages": 1}
    r = client.post("/chat", json={"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages[0].content[0].text")
    r = client.post("/chat", json={"model": "m", "messages": [{"role": "function", "content": "x"}]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "messages[0].role")
    assert client.get("/openapi.json").status_code == 200
