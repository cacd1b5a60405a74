"""A syslog receiver on 127.0.0.1 (UDP) for the session platform's `--log-target`: it keeps the
latest lines (JSON, MSHIP_LOG_FORMAT=json) for tests to search by request id."""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from typing import Any


class SyslogListener:
    def __init__(self, keep: int = 20_000) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._thread = threading.Thread(target=self._run, daemon=True, name="syslog")
        self._thread.start()

    @property
    def target(self) -> str:
        return f"syslog://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:  # closed
                return
            self.lines.append(data.decode(errors="replace"))

    def records(self, **match: str) -> list[dict[str, Any]]:
        """The JSON records received whose fields equal `match`."""
        out = []
        for line in list(self.lines):
            start = line.find("{")
            try:
                rec = json.loads(line[start:]) if start >= 0 else None
            except ValueError:
                continue
            if isinstance(rec, dict) and all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out

    def wait_for(self, timeout_s: float = 10, **match: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while not (found := self.records(**match)):
            assert time.monotonic() < deadline, f"no log line with {match} within {timeout_s}s"
            time.sleep(0.05)
        return found

    def close(self) -> None:
        self.sock.close()
