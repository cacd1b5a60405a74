"""How every mship process logs: one call (`configure_logging`) at its start, read from the
node's environment (services/cluster/telemetry.py puts `--log-target` there):

- `MSHIP_LOG_FORMAT=json`: one JSON object per line (`ts`, `level`, `logger`, `message`,
  `service`, `pid`, `request_id` when the line belongs to a request, `exc` on an exception);
  otherwise plain text with the request id in brackets.
- `MSHIP_LOG_LEVEL` (INFO by default).
- `MSHIP_LOG_TARGET=syslog://host:port` (UDP) or `syslog+tcp://host:port` (one line per message):
  the lines go there as well as to stderr.

The request id of the request being served lives in `request_id` (a context variable): the edge
sets it from `x-request-id` (or makes one), gRPC calls carry it in metadata, and every server sets
it for the handler (`services/common/interceptors.py`), so gateway, worker and state lines of one
request share it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from contextvars import ContextVar
from urllib.parse import urlsplit

from services.common.vocabulary import ENV_LOG_FORMAT, ENV_LOG_LEVEL, ENV_LOG_TARGET

REQUEST_ID_METADATA = "x-request-id"
MAX_REQUEST_ID = 128
request_id: ContextVar[str] = ContextVar("mship_request_id", default="")
LOGGERS = ("services", "clients")  # ours; Ray's and the engines' keep their own handlers
_configured: set[str] = set()
_PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}  # syslog severities
_FACILITY_USER = 1


def parse_log_target(url: str) -> tuple[str, int, int]:
    """syslog://host:port -> (host, port, SOCK_DGRAM); syslog+tcp:// -> SOCK_STREAM. ValueError if not."""
    parts = urlsplit(url)
    kinds = {"syslog": socket.SOCK_DGRAM, "syslog+udp": socket.SOCK_DGRAM, "syslog+tcp": socket.SOCK_STREAM}
    if parts.scheme not in kinds or not parts.hostname or not parts.port:
        raise ValueError(f"{url!r} is not syslog://host:port or syslog+tcp://host:port")
    return parts.hostname, parts.port, kinds[parts.scheme]


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the context it was logged in."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage(),
               "service": self.service, "pid": record.process}
        if getattr(record, "request_id", ""):
            out["request_id"] = record.request_id  # type: ignore[attr-defined]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        line = json.dumps(out, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (text decoded with surrogateescape): ASCII escapes
            return json.dumps(out)
        return line


class TextFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {service} %(name)s%(rid)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", "")
        record.rid = f" [{rid}]" if rid else ""
        return super().format(record)


class LineSysLogHandler(logging.Handler):
    """RFC 3164-style syslog; over TCP each message ends with a newline (RFC 6587 framing).

    Over UDP each line is one datagram, sent as it comes: a datagram never waits for its collector,
    and a burst of lines (DEBUG) is not dropped here. Over TCP the logging thread (an event loop's,
    mostly) only formats the line and queues it: one daemon thread sends, so a collector that is
    down, slow or stops reading never blocks a process. While it cannot be reached the lines are
    dropped (MAX_QUEUED at most wait), it is said once on stderr, and it is connected again (every
    `retry_s`) once it is back."""

    MAX_QUEUED = 10_000
    TIMEOUT_S = 5.0  # a connect or a send to a stuck collector gives up after this

    def __init__(self, host: str, port: int, socktype: int) -> None:
        super().__init__()
        self.address, self.socktype = (host, port), socktype
        self.tcp = socktype == socket.SOCK_STREAM
        self.retry_s = 2.0
        self.dropped = 0
        self._start()
        ref = weakref.ref(self)  # a forked child has no sender thread: it starts its own
        os.register_at_fork(after_in_child=lambda: (h := ref()) is not None and h._start())

    def _start(self) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(self.MAX_QUEUED)
        self._sock: socket.socket | None = None  # the parent's, after a fork: never closed here
        self._down_until = 0.0
        self._said_down = False
        self._thread: threading.Thread | None = None
        if self.tcp:
            self._thread = threading.Thread(target=self._send_forever, name="mship-syslog", daemon=True)
            self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + ("\n" if self.tcp else "")
            prio = (_FACILITY_USER << 3) | _PRIORITY.get(record.levelname, 6)
            message = f"<{prio}>{line}".encode("utf-8", "backslashreplace")
            if self.tcp:
                self._queue.put_nowait(message)
            else:
                self._send_datagram(message)
        except queue.Full:
            self.dropped += 1
        except Exception:
            self.handleError(record)

    def _send_forever(self) -> None:
        while (message := self._queue.get()) is not None:
            if time.monotonic() < self._down_until:
                self.dropped += 1
                continue
            try:
                self._send(message)
                self._said_down = False
            except OSError as e:
                self._disconnect()
                self.dropped += 1
                self._down_until = time.monotonic() + self.retry_s
                if not self._said_down:
                    self._said_down = True
                    host, port = self.address
                    print(f"mship: syslog target {host}:{port} unreachable ({e}); its lines are dropped "
                          "until it is back", file=sys.stderr)
        self._disconnect()

    def _send_datagram(self, message: bytes) -> None:
        """Unconnected: a collector that is down costs nothing (no ICMP error comes back to it)."""
        try:
            if self._sock is None:
                host, port = self.address
                family, kind, proto, _, address = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)[0]
                self._sock, self._datagram_to = socket.socket(family, kind, proto), address
            self._sock.sendto(message, self._datagram_to)
        except OSError:  # unresolvable, or the socket's buffer full: this line is lost, not the process
            self.dropped += 1

    def _send(self, message: bytes) -> None:
        if self._sock is None:
            host, port = self.address
            family, kind, proto, _, address = socket.getaddrinfo(host, port, 0, self.socktype)[0]
            sock = socket.socket(family, kind, proto)
            sock.settimeout(self.TIMEOUT_S)
            try:
                sock.connect(address)  # UDP too: one address, and an unreachable port is reported
            except OSError:
                sock.close()
                raise
            self._sock = sock
        if self.tcp:
            self._sock.sendall(message)
        else:
            self._sock.send(message)

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Send what is queued (waiting at most TIMEOUT_S), then stop."""
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=self.TIMEOUT_S)
            self._thread.join(self.TIMEOUT_S)
        else:
            self._disconnect()
        super().close()


def configure_logging(service: str) -> None:
    """Our loggers' handlers for this process (once per service name and process)."""
    if service in _configured:
        return
    _configured.add(service)
    fmt: logging.Formatter = JsonFormatter(service) if os.environ.get(ENV_LOG_FORMAT) == "json" \
        else TextFormatter(service)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if target := os.environ.get(ENV_LOG_TARGET):
        try:
            handlers.append(LineSysLogHandler(*parse_log_target(target)))
        except (ValueError, OSError) as e:  # a bad target must not stop the service; say why once
            print(f"mship: {ENV_LOG_TARGET}={target!r} not used: {e}", file=sys.stderr)
    level = getattr(logging, os.environ.get(ENV_LOG_LEVEL, "INFO").upper(), logging.INFO)
    for handler in handlers:
        handler.setFormatter(fmt)
        handler.addFilter(RequestIdFilter())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        for handler in handlers:
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False  # Ray's root handlers would print each line a second time


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The metadata that carries this request's id on a gRPC call it makes."""
    rid = request_id.get()
    return ((REQUEST_ID_METADATA, rid),) if rid else ()


def clean_request_id(given: str | bytes | None) -> str:
    """A client's request id if it is a sane one (printable ASCII, bounded), else ""."""
    if isinstance(given, bytes):
        given = given.decode("latin-1")
    if not given or len(given) > MAX_REQUEST_ID or not given.isascii() or not given.isprintable():
        return ""
    return given
