"""The OpenAI error object: an HTTP status plus the body `{"error": {"message", "type", "param", "code"}}`.

Every error the edge answers is an `OpenAIError`; bad input is always 4xx, never 500. The edge
turns it into an HTTP response (`services.gateway.edge.errors`) and gRPC failures into it
(`services.gateway.edge.upstream`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"
INTERNAL_MESSAGE = "The server had an error while processing your request. Sorry about that!"


class OpenAIError(Exception):
    """An HTTP error with an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __repr__(self) -> str:
        return f"OpenAIError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def invalid_json() -> OpenAIError:
    return OpenAIError(400, "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                            "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
                            "sent was not valid JSON.)", code="invalid_json")


def body_too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"The request body is larger than the limit of {limit} bytes.",
                       code="request_too_large")


def model_not_found(name: str | None) -> OpenAIError:
    # OpenAI answers 404 with type invalid_request_error and code model_not_found.
    return OpenAIError(404, f"The model '{name or ''}' does not exist or you do not have access to it.",
                       param="model", code="model_not_found")


def retry_after_header(retry_after_s: float | None) -> dict[str, str]:
    """`Retry-After` in whole seconds, rounded up, at least 1 (clients treat 0 as "hammer now")."""
    seconds = 1 if retry_after_s is None or retry_after_s != retry_after_s else max(1, math.ceil(retry_after_s))
    return {"Retry-After": str(seconds)}


def too_many_connections(limit: int) -> OpenAIError:
    """A gateway replica past its cap on open connections (MSHIP_MAX_CONNECTIONS): 503, retried
    elsewhere (the connection closes)."""
    return OpenAIError(503, f"This gateway replica has {limit} open connections, its limit; retry (another "
                       "replica may).", type=SERVER_ERROR, code="too_many_connections", headers=retry_after_header(1))


def overloaded(retry_after_s: float | None = None) -> OpenAIError:
    """Every replica of the model is at its backpressure limits (running and queued): 503 with
    Retry-After, at once. (A caller over its own rate limits gets 429 from admission instead.)"""
    return OpenAIError(503, "The model is at capacity: every replica is at its request limits. Please retry after "
                       "the Retry-After delay.", type=SERVER_ERROR, code="overloaded",
                       headers=retry_after_header(retry_after_s))


def unavailable(retry_after_s: float | None = None) -> OpenAIError:
    """The model is not serving right now (no live replica, routes not received yet): 503 with Retry-After."""
    return OpenAIError(503, "The model is temporarily unavailable, please try again later.", type=SERVER_ERROR,
                       code="service_unavailable", headers=retry_after_header(retry_after_s))


def internal_error() -> OpenAIError:
    return OpenAIError(500, INTERNAL_MESSAGE, type=SERVER_ERROR)
