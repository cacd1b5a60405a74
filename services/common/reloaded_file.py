"""A config file an operator edits while the platform runs (API keys, rate-limit overrides): parsed
at start, re-read when it changes (its mtime and size, looked at no more than once a second, on the
caller's next use), and a file that no longer parses keeps the last good value (logged)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
CHECK_EVERY_S = 1.0


class ReloadedFile(Generic[T]):
    def __init__(self, path: str, parse: Callable[[str], T], empty: T, what: str) -> None:
        self.path, self._parse, self.what = Path(path), parse, what
        self._value, self._stamp, self._checked = empty, None, 0.0
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._stamp:
                return
            value = self._parse(self.path.read_text())
        except (OSError, ValueError) as e:  # keep serving with the last good value
            log.error("%s not (re)loaded: %s", self.what, e)
            return
        self._value, self._stamp = value, stamp
        log.info("%s %s loaded", self.what, self.path)

    @property
    def value(self) -> T:
        if (now := time.monotonic()) - self._checked >= CHECK_EVERY_S:
            with self._lock:
                self._checked = now
                self._load()
        return self._value

    def check_now(self) -> None:
        """The next `value` looks at the file (tests; otherwise at most once a second)."""
        self._checked = 0.0
