"""The audit trail (optional, `MSHIP_AUDIT_LOG`): one JSON record per API request, written when its
response has ended (a stream included): time, identity, client address, method, route, model,
status, tokens, latency, request id (the answer's `x-request-id`: edge/request_id.py), the key
that joins a client's report to the record.

Prompts and completions are recorded only with `MSHIP_AUDIT_CONTENT=1`: the request body, and the
response body of a non-streamed answer (each up to CONTENT_LIMIT bytes). Even then the secrets a
request hands to a tool server (`tools[].headers` values, `tools[].authorization`) are redacted. `MSHIP_AUDIT_LOG=-`
writes to the `mship.audit` logger; a path appends JSON lines to that file.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from services.common.logs import request_id as current_request_id

log = logging.getLogger("mship.audit")
CONTENT_LIMIT = 64 * 1024
PREFIX = "/v1/"


class AuditSink:
    def __init__(self, target: str) -> None:
        self.target = target
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str)
        if self.target == "-":
            log.info(line)
            return
        with self._lock, open(self.target, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write(line + "\n")


REDACTED = "[redacted]"


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks)[:CONTENT_LIMIT].decode("utf-8", "replace")


def request_text(chunks: list[bytes]) -> str:
    """The request body as recorded: tool servers' credentials replaced by REDACTED."""
    body = b"".join(chunks)
    try:
        parsed = json.loads(body)
    except ValueError:
        return _text(chunks)
    tools = parsed.get("tools") if isinstance(parsed, dict) else None
    if not isinstance(tools, list) or not any(isinstance(t, dict) and ("headers" in t or "authorization" in t)
                                              for t in tools):
        return _text(chunks)
    for tool in tools:
        if isinstance(tool, dict):
            if isinstance(tool.get("headers"), dict):
                tool["headers"] = dict.fromkeys(tool["headers"], REDACTED)
            if "authorization" in tool:
                tool["authorization"] = REDACTED
    return _text([json.dumps(parsed).encode()])


class AuditMiddleware:
    """Outside authentication (a refused request is recorded too); inside CORS."""

    def __init__(self, app, sink: AuditSink, content: bool = False) -> None:
        self.app, self.sink, self.content = app, sink, content

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        request_id = current_request_id.get()
        state: dict[str, Any] = {"status": 0, "streamed": False}
        request_body: list[bytes] = []
        response_body: list[bytes] = []

        async def recording_receive():
            message = await receive()
            if self.content and message["type"] == "http.request":
                request_body.append(message.get("body", b""))
            return message

        async def recording_send(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                out = dict(message.get("headers") or [])
                state["streamed"] = out.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and self.content and not state["streamed"]:
                response_body.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, recording_receive if self.content else receive, recording_send)
        finally:
            self.sink.write(self._record(scope, state, request_id, time.monotonic() - t0,
                                         request_body, response_body))

    def _record(self, scope, state: dict[str, Any], request_id: str, latency_s: float,
                request_body: list[bytes], response_body: list[bytes]) -> dict[str, Any]:
        caller = scope.get("state", {}).get("caller")
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z", "request_id": request_id,
                  "identity": caller.identity if caller else None,
                  "client": scope["client"][0] if scope.get("client") else None,
                  "method": scope["method"], "route": scope["path"], "model": caller.model if caller else None,
                  "status": state["status"] or 500, "streamed": state["streamed"],
                  "tokens": caller.used_tokens if caller else None, "latency_ms": round(latency_s * 1000, 2)}
        if self.content:
            record["request"] = request_text(request_body)
            if not state["streamed"]:
                record["response"] = _text(response_body)
        return record
