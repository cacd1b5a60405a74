"""A config file an operator edits while the platform runs (API keys, rate-limit overrides): parsed
at start, re-read when it changes (its inode, mtime, ctime and size, looked at no more than once a
second, on the caller's next use), and a file that no longer parses keeps the last good value
(logged once per version of the file).

A file caught mid-write keeps the last good value too: one that is empty (nothing but whitespace:
an editor or `>` truncating it before writing), or one that changed while it was being read, is
looked at again on the next check. A file that says "nothing" on purpose says it with a comment.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
CHECK_EVERY_S = 1.0
Stamp = tuple[int, int, int, int]
MISSING: Stamp = (0, 0, 0, -1)


def _stamp(st: os.stat_result) -> Stamp:
    # ctime and the inode cannot be set back by a copy that keeps the mtime (`cp -p`, rsync) or by
    # a rename over the file (a ConfigMap's swap): a same-size edit is still seen
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


class ReloadedFile(Generic[T]):
    def __init__(self, path: str, parse: Callable[[str], T], empty: T, what: str) -> None:
        self.path, self._parse, self.what = Path(path), parse, what
        self._value, self._stamp, self._checked = empty, None, 0.0
        self._loaded = False  # a good value was read from the file
        self._refused: Stamp | None = None  # the version last refused (logged once)
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            stamp = _stamp(self.path.stat())
        except OSError as e:  # gone (renamed over, deleted): the last good value stays
            return self._refuse(MISSING, str(e))
        if stamp in (self._stamp, self._refused):
            return
        try:
            text = self.path.read_text()
            if _stamp(self.path.stat()) != stamp:
                return  # written to while read: the next check reads what the writer left
            if self._loaded and not text.strip():
                return self._refuse(stamp, "it is empty (being written?)")
            value = self._parse(text)
        except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            return self._refuse(stamp, str(e))
        self._value, self._stamp, self._loaded, self._refused = value, stamp, True, None
        log.info("%s %s loaded", self.what, self.path)

    def _refuse(self, stamp: Stamp, why: str) -> None:
        """Keep serving the last good value; say so once per version of the file."""
        if stamp != self._refused:
            log.error("%s %s not (re)loaded, %s: %s", self.what, self.path,
                      "keeping the last good one" if self._loaded else "nothing loaded yet", why)
        self._refused = stamp

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
