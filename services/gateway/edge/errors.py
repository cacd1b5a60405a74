"""Errors as HTTP: every error the edge answers is an OpenAI error body; unexpected exceptions
become a bare 500 (logged here with their traceback, never shown to the client)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.gateway.protocol_common.openai_error import (
    INVALID_REQUEST,
    SERVER_ERROR,
    OpenAIError,
    internal_error,
)
from services.gateway.protocol_common.validation import from_validation

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's code: nobody reads it, but logs and metrics do


class _AsciiJSON(JSONResponse):
    """An error body echoes client input (a model name, a parameter): ASCII escapes encode any
    string, a lone surrogate included, where UTF-8 would raise and drop the connection."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


async def send_error(send, err: OpenAIError, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """The error as a whole HTTP response (its own headers, e.g. Retry-After, and `headers`), from
    pure ASGI middleware or the HTTP server (before any route runs)."""
    body = json.dumps(err.body()).encode()
    own = [(name.lower().encode(), value.encode()) for name, value in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *own, *headers]})
    await send({"type": "http.response.body", "body": body})


def error_response(err: OpenAIError) -> JSONResponse:
    return _AsciiJSON(err.body(), status_code=err.status, headers=err.headers or None)


def install_handlers(app: FastAPI) -> None:
    async def on_openai(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        request.scope.setdefault("state", {})["error_code"] = exc.code  # the refusal's reason, for metrics
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(from_validation(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = OpenAIError(exc.status_code, str(exc.detail), type=INVALID_REQUEST if exc.status_code < 500
                          else SERVER_ERROR, headers=exc.headers)
        return error_response(err)

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(internal_error())

    app.add_exception_handler(OpenAIError, on_openai)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_crash)
