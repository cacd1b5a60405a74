"""Logs (services/common/logs.py): JSON lines with the request id; syslog over UDP and TCP to a local
listener; the edge's `x-request-id` (the client's, when sane, or a new one) reaches the worker's
handler through gRPC metadata, so its lines carry the same id."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from services.common import logs
from services.common.logs import (
    JsonFormatter,
    LineSysLogHandler,
    RequestIdFilter,
    clean_request_id,
    parse_log_target,
    request_id,
)
from tests.platform_process import free_port
from tests.unit.gateway_harness import CHAT, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)


def record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    rec = logging.LogRecord("services.worker.servicer", level, __file__, 1, message, (), None)
    RequestIdFilter().filter(rec)
    return rec


def test_json_lines_carry_the_request_id_of_their_context():
    token = request_id.set("req-42")
    try:
        line = json.loads(JsonFormatter("worker").format(record("infer ended")))
    finally:
        request_id.reset(token)
    assert {k: line[k] for k in ("level", "logger", "message", "service", "request_id")} == {
        "level": "INFO", "logger": "services.worker.servicer", "message": "infer ended", "service": "worker",
        "request_id": "req-42"}
    assert "request_id" not in json.loads(JsonFormatter("worker").format(record("no request")))


def listen(kind: int) -> tuple[socket.socket, list[bytes], threading.Thread]:
    sock = socket.socket(socket.AF_INET, kind)
    sock.bind(("127.0.0.1", 0))
    got: list[bytes] = []
    if kind == socket.SOCK_STREAM:
        sock.listen(1)

        def serve() -> None:
            conn, _ = sock.accept()
            with conn:
                while data := conn.recv(65536):
                    got.append(data)
    else:
        def serve() -> None:
            got.append(sock.recv(65536))
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return sock, got, thread


@pytest.mark.parametrize(("scheme", "kind"), [("syslog", socket.SOCK_DGRAM), ("syslog+tcp", socket.SOCK_STREAM)])
def test_syslog_lines_reach_a_local_listener(scheme, kind):
    sock, got, thread = listen(kind)
    host, port = sock.getsockname()
    target = parse_log_target(f"{scheme}://{host}:{port}")
    assert target == (host, port, kind)
    handler = LineSysLogHandler(*target)
    handler.setFormatter(JsonFormatter("gateway"))
    handler.addFilter(RequestIdFilter())
    token = request_id.set("abc")
    try:
        handler.emit(record("hello syslog"))
    finally:
        request_id.reset(token)
        handler.close()
    thread.join(5)
    sock.close()
    data = b"".join(got).decode()
    assert data.startswith("<14>") and json.loads(data[4:].strip())["request_id"] == "abc"  # user.info
    assert data.endswith("\n") == (kind == socket.SOCK_STREAM)  # TCP: one message per line


@pytest.mark.parametrize("bad", ["udp://h:1", "syslog://h", "syslog://:514", "file:///var/log/x"])
def test_a_bad_log_target_is_refused(bad):
    with pytest.raises(ValueError):
        parse_log_target(bad)


def test_only_sane_client_request_ids_are_kept():
    assert clean_request_id("abc-123") == "abc-123"
    assert clean_request_id(b"abc") == "abc"
    assert clean_request_id("x" * 129) == clean_request_id("a\nb") == clean_request_id("é") == ""


class Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(RequestIdFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, rec: logging.LogRecord) -> None:
        self.records.append(rec)


async def test_the_edge_request_id_is_echoed_and_reaches_the_worker_handler(workers, gateway: Gateway):
    seen = Seen()
    worker_log = logging.getLogger("services.worker.servicer")
    level = worker_log.level
    worker_log.addHandler(seen)
    worker_log.setLevel(logging.DEBUG)
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
            given = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "client-id-1"})
            made = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "x" * 200})
            refused = await client.post("/v1/chat/completions", json={"model": "m"})
    finally:
        worker_log.removeHandler(seen)
        worker_log.setLevel(level)
    assert given.status_code == 200 and given.headers["x-request-id"] == "client-id-1"
    assert len(made.headers["x-request-id"]) == 32 and made.headers["x-request-id"] != "x" * 200
    assert refused.status_code == 400 and len(refused.headers["x-request-id"]) == 32  # even a refusal has one
    ids = [r.request_id for r in seen.records if r.getMessage().startswith("infer ")]  # type: ignore[attr-defined]
    assert ids == ["client-id-1", made.headers["x-request-id"]]


def test_configure_logging_is_idempotent_and_stops_propagation(monkeypatch):
    monkeypatch.setattr(logs, "_configured", set())
    monkeypatch.setenv("MSHIP_LOG_FORMAT", "json")
    monkeypatch.setenv("MSHIP_LOG_LEVEL", "debug")
    logger = logging.getLogger("clients")
    before = (list(logger.handlers), logger.level, logger.propagate)
    try:
        logs.configure_logging("cli")
        logs.configure_logging("cli")
        assert len(logger.handlers) == 1 and isinstance(logger.handlers[0].formatter, JsonFormatter)
        assert (logger.level, logger.propagate) == (logging.DEBUG, False)
    finally:
        logger.handlers[:], logger.level, logger.propagate = before


def stuck_collector() -> tuple[socket.socket, list[socket.socket]]:
    """A TCP syslog collector that accepts and then never reads (its buffers fill up)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(sock.accept()[0]), daemon=True).start()
    return sock, accepted


def test_a_collector_that_stops_reading_never_blocks_the_logging_thread():
    sock, accepted = stuck_collector()
    host, port = sock.getsockname()
    handler = LineSysLogHandler(*parse_log_target(f"syslog+tcp://{host}:{port}"))
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.handleError = lambda rec: None  # type: ignore[method-assign]  (once reset: a traceback a line)
    line = record("x" * 4096)

    def log_a_lot() -> None:
        for _ in range(8192):  # 32 MiB: far beyond what the sockets buffer
            handler.emit(line)

    logging_thread = threading.Thread(target=log_a_lot, daemon=True)
    logging_thread.start()
    logging_thread.join(20)
    blocked = logging_thread.is_alive()
    for s in (*accepted, sock):  # unblocks a blocked send (connection reset)
        s.close()
    handler.close()
    assert not blocked, "logging blocked on a syslog collector that does not read"


def test_a_collector_down_at_start_or_restarted_gets_the_lines_once_it_is_back():
    port = free_port()  # nothing listens on it yet, and nothing connecting out takes it meanwhile
    handler = LineSysLogHandler("127.0.0.1", port, socket.SOCK_STREAM)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.retry_s = 0.0  # type: ignore[attr-defined]
    handler.handleError = lambda rec: None  # type: ignore[method-assign]
    try:
        handler.emit(record("lost"))  # never raises, never blocks: dropped while the collector is down
        for restart in range(2):
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(1)
            server.settimeout(0.05)
            got = b""
            deadline = time.monotonic() + 10
            conn = None
            while f"up {restart}".encode() not in got:  # the handler reconnects on a later line
                assert time.monotonic() < deadline, f"no line reached the collector (start {restart})"
                handler.emit(record(f"up {restart}"))
                try:
                    conn = conn or server.accept()[0]
                    conn.settimeout(0.05)
                    got += conn.recv(65536)
                except TimeoutError:
                    continue
            for s in (conn, server):
                if s is not None:
                    s.close()
    finally:
        handler.close()


def test_json_lines_stay_utf8_with_a_lone_surrogate():
    line = JsonFormatter("gateway").format(record("model 'a\ud800b' not found"))
    assert json.loads(line.encode("utf-8"))["message"] == "model 'a\ud800b' not found"


def test_a_burst_of_lines_over_udp_is_sent_not_dropped():
    """A datagram never waits for its collector, so nothing is queued (and dropped) over UDP: a
    DEBUG burst larger than the TCP queue goes out whole, the line after it included."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    handler = LineSysLogHandler(*sock.getsockname(), socket.SOCK_DGRAM)
    handler.setFormatter(logging.Formatter("%(message)s"))
    try:
        for i in range(LineSysLogHandler.MAX_QUEUED + 2000):
            handler.emit(record(f"burst {i}"))
        assert handler.dropped == 0
    finally:
        handler.close()
        sock.close()
