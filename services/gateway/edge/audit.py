"""The audit trail (optional, `MSHIP_AUDIT_LOG`): one JSON record per API request, written when its
response has ended (a stream included): time, identity, client address, method, route, model,
status, tokens, latency, request id (the answer's `x-request-id`: edge/request_id.py), the key
that joins a client's report to the record.

Prompts and completions are recorded only with `MSHIP_AUDIT_CONTENT=1`: the request body, and the
response body of a non-streamed answer (each up to CONTENT_LIMIT bytes). Even then the secrets a
request hands to a tool server (`tools[].headers` values, `tools[].authorization`) are redacted. `MSHIP_AUDIT_LOG=-`
writes to the `mship.audit` logger; a path appends JSON lines to that file.

Records are written by a thread of their own (`AuditSink`): a slow or stalled disk must not hold
the event loop, where every stream of the replica waits behind it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from typing import Any

from services.common.logs import request_id as current_request_id
from services.gateway.edge.metrics import AUDIT_DROPPED

records = logging.getLogger("mship.audit")  # MSHIP_AUDIT_LOG=-: the records themselves
log = logging.getLogger(__name__)
CONTENT_LIMIT = 64 * 1024
FILE_MODE = 0o640  # a new audit log: it may hold tenants' prompts (MSHIP_AUDIT_CONTENT)
PREFIX = "/v1/"


class AuditSink:
    """Appends each record to the target from a writer thread; `write()` never waits for the disk.
    A write that fails (a full disk, a missing directory) is tried again every RETRY_S with the
    records kept. At most MAX_WAITING records wait: past that a record is dropped and counted
    (`mship_gateway_audit_records_dropped_total`), not the replica's memory grown without bound.
    The file is opened for each batch, so a rotated log is followed (as by logrotate's `create`).
    `close()` writes what waits."""

    MAX_WAITING = 100_000
    RETRY_S = 1.0

    def __init__(self, target: str) -> None:
        self.target = target
        self._lines: collections.deque[str] = collections.deque()
        self._changed = threading.Condition()
        self._closed = False
        self._unwritten = memoryview(b"")  # the bytes of the batch being written not written yet
        self._thread = threading.Thread(target=self._run, name="mship-audit", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._changed:
            if len(self._lines) >= self.MAX_WAITING:
                AUDIT_DROPPED.inc()
                return
            self._lines.append(line)
            self._changed.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        failing = False
        batch: list[str] = []  # taken from the queue, not yet wholly written
        while True:
            if not batch:
                with self._changed:
                    while not self._lines and not self._closed:
                        self._changed.wait()
                    if not self._lines:
                        return
                    batch = list(self._lines)
                if self.target != "-":
                    self._unwritten = memoryview("".join(line + "\n" for line in batch).encode(
                        "utf-8", "backslashreplace"))
            try:
                self._append(batch)
            except OSError as e:
                if not failing:
                    log.error("cannot write the audit log %s (%s); trying again every %g s", self.target, e,
                              self.RETRY_S)
                failing = True
                with self._changed:
                    if not self._closed:
                        self._changed.wait(self.RETRY_S)
                        continue
                    unfinished = bytes(self._unwritten).count(b"\n")  # the batch's lines not wholly written
                    AUDIT_DROPPED.inc(len(self._lines) - len(batch) + unfinished)  # stopping: lost
                    return
            if failing:
                log.warning("the audit log %s is written again", self.target)
                failing = False
            with self._changed:
                for _ in batch:  # written: only now out of the queue (a failed write keeps them)
                    self._lines.popleft()
            batch = []

    def _append(self, batch: list[str]) -> None:
        if self.target == "-":
            for line in batch:
                records.info(line)
            return
        # One write() of the whole batch to a file opened for appending: the replicas of a node that
        # share the file never interleave inside each other's lines. A write that fails part-way (the
        # disk filled) leaves the rest in `_unwritten`, and the retry resumes there: no record twice,
        # no line torn by a second copy of the batch.
        fd = os.open(self.target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            while self._unwritten:
                self._unwritten = self._unwritten[os.write(fd, self._unwritten):]
        finally:
            os.close(fd)


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
