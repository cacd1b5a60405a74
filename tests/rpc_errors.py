"""Every kind of `ServiceError` the services raise, and the check that a call carried one intact.

Each service's error test raises these from a servicer mounted on that service's real server
(with the real interceptors) and reads them back as a client would.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from services.common.errors import Reason, ServiceError, invalid_parameter

ERROR_KINDS: dict[str, ServiceError] = {
    "invalid_parameter": invalid_parameter("max_tokens", "max_tokens must be at least 1"),
    "context_too_long": ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.CONTEXT_TOO_LONG, "too long",
                                     field_violations=[("messages", "input is longer than the context")],
                                     metadata={"max_model_len": "64"}),
    "unsupported_input": ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT, "no images",
                                      field_violations=[("messages[0].content[1]", "image input")]),
    "model_not_found": ServiceError(grpc.StatusCode.NOT_FOUND, Reason.MODEL_NOT_FOUND, "no model 'x'",
                                    metadata={"model": "x"}),
    "not_found": ServiceError(grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND, "no such thing"),
    "not_ready": ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.NOT_READY, "still loading", retry_after_s=1.5),
    "overloaded": ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED, "at the limit",
                               retry_after_s=2.0),
    "engine_error": ServiceError(grpc.StatusCode.INTERNAL, Reason.ENGINE_ERROR, "engine error: boom"),
}


def assert_carries(err: grpc.aio.AioRpcError, expected: ServiceError) -> None:
    """`err` (as a client got it) has `expected`'s code, message, ErrorInfo, BadRequest and RetryInfo."""
    assert err.code() == expected.code, (err.code(), expected.code)
    assert err.details() == expected.message
    status = rpc_status.from_call(err)
    assert status is not None, "no google.rpc.Status in the trailers"
    found: dict[str, object] = {}
    for detail in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                found[kind.__name__] = message
    info = found["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.reason == Reason.Name(expected.reason) and info.domain == "mship"
    assert dict(info.metadata) == expected.metadata
    bad = found.get("BadRequest")
    violations = [(v.field, v.description) for v in bad.field_violations] if bad is not None else []  # type: ignore[attr-defined]
    assert violations == expected.field_violations
    retry = found.get("RetryInfo")
    if expected.retry_after_s is None:
        assert retry is None
    else:
        assert retry is not None
        assert retry.retry_delay.ToNanoseconds() == int(expected.retry_after_s * 1e9)  # type: ignore[attr-defined]
