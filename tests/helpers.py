"""Helpers every test tier shares: polls with a deadline (never bare sleeps) and refusal checks."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from services.gateway.protocol_common.openai_error import OpenAIError


async def until(check: Callable[[], Any], what: str = "the condition", timeout_s: float = 5.0,
                poll_s: float = 0.005) -> None:
    """Poll `check` on the running loop until it is truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(poll_s)


def until_sync(check: Callable[[], Any], what: str = "the condition", timeout_s: float = 60.0,
               poll_s: float = 0.2) -> None:
    """`until` for synchronous tests (polling a platform process from outside)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(poll_s)


def refused(parse: Callable[[Any], Any], body: Any, status: int = 400) -> OpenAIError:
    """`parse(body)` raises an OpenAI error with `status` and type invalid_request_error."""
    with pytest.raises(OpenAIError) as e:
        parse(body)
    err = e.value
    assert err.status == status, err
    assert err.body()["error"]["type"] == "invalid_request_error"
    return err


def raw_headers(headers: dict[str, str] | None) -> bytes:
    """Request header lines for a hand-written HTTP request."""
    return b"".join(f"{k}: {v}\r\n".encode() for k, v in (headers or {}).items())


def stream_then_drop(http_port: int, after_chunks: int, model: str = "tiny",
                     headers: dict[str, str] | None = None) -> None:
    """Open a long SSE chat stream on a raw socket, read `after_chunks` events, then hang up."""
    body = (b'{"model": "' + model.encode() + b'", "stream": true, "max_tokens": 900, "ignore_eos": true, '
            b'"messages": [{"role": "user", "content": "Tell me a story."}]}')
    sock = socket.create_connection(("127.0.0.1", http_port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + raw_headers(headers) + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while seen.count(b"data: ") < after_chunks:
        seen += sock.recv(65536)
    sock.close()


class FakeClock:
    """A monotonic clock a test moves by hand (`clock.now += 5`)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
