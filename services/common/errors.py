"""Rich gRPC errors: a status code plus google.rpc details (ErrorInfo, BadRequest, RetryInfo).

Services raise `ServiceError`; the server's `ErrorInterceptor` (services/common/interceptors.py)
turns it into the call's status; clients read it back with `ErrorDetails.from_rpc_error`. One
place each way, so every hop speaks the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from mship.common.v1 import common_pb2

DOMAIN = "mship"
Reason = common_pb2.ErrorReason


@dataclass
class ServiceError(Exception):
    """An error with a gRPC code, an mship reason and optional field violations / retry delay."""

    code: grpc.StatusCode
    reason: int  # common_pb2.ErrorReason value
    message: str
    field_violations: list[tuple[str, str]] = field(default_factory=list)  # (field, description)
    retry_after_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def to_status(self) -> grpc.Status:
        details: list[any_pb2.Any] = []
        info = error_details_pb2.ErrorInfo(reason=Reason.Name(self.reason), domain=DOMAIN, metadata=self.metadata)
        details.append(_pack(info))
        if self.field_violations:
            bad = error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in self.field_violations])
            details.append(_pack(bad))
        if self.retry_after_s is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_after_s * 1e9))
            details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        status = status_pb2.Status(code=self.code.value[0], message=self.message, details=details)
        return rpc_status.to_status(status)


def invalid_parameter(param: str, message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PARAMETER, message,
                        field_violations=[(param, message)])


def _pack(msg) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


@dataclass
class ErrorDetails:
    """What a client reads off a failed call."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    field_violations: list[tuple[str, str]] = field(default_factory=list)
    retry_after_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def dropped(self) -> bool:
        """CANCELLED with no reason: gRPC itself ended the call, not the service, which always names
        one (a Cancel by id, a client that left). The serving process was stopping, or the channel to
        it was closed: nothing the caller asked for, and the call may be tried elsewhere."""
        return self.code == grpc.StatusCode.CANCELLED and not self.reason

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> ErrorDetails:
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        out = cls(code=code, message=(err.details() or "") if hasattr(err, "details") else str(err))
        status = _status_of(err)
        if status is None:
            return out
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                out.reason, out.metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                out.field_violations = [(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                out.retry_after_s = retry.retry_delay.ToNanoseconds() / 1e9
        return out


def _status_of(err: grpc.RpcError) -> status_pb2.Status | None:
    for key, value in (err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else ():
        if key == rpc_status.GRPC_DETAILS_METADATA_KEY:
            status = status_pb2.Status()
            status.MergeFromString(value)
            return status
    return None
