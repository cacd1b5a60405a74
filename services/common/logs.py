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

import json
import logging
import logging.handlers
import os
import socket
import sys
import time
from contextvars import ContextVar
from urllib.parse import urlsplit

from services.common.vocabulary import ENV_LOG_FORMAT, ENV_LOG_LEVEL, ENV_LOG_TARGET

REQUEST_ID_METADATA = "x-request-id"
MAX_REQUEST_ID = 128
request_id: ContextVar[str] = ContextVar("mship_request_id", default="")
LOGGERS = ("services", "clients")  # ours; Ray's and the engines' keep their own handlers
_configured: set[str] = set()


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
        return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {service} %(name)s%(rid)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", "")
        record.rid = f" [{rid}]" if rid else ""
        return super().format(record)


class LineSysLogHandler(logging.handlers.SysLogHandler):
    """RFC 3164-style syslog; over TCP each message ends with a newline (RFC 6587 framing)."""

    def __init__(self, host: str, port: int, socktype: int) -> None:
        super().__init__(address=(host, port), socktype=socktype)
        self.append_nul = False
        self.tcp = socktype == socket.SOCK_STREAM

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record) + ("\n" if self.tcp else "")


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
