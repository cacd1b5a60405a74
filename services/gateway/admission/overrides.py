"""Per-identity rate-limit overrides: `MSHIP_RATE_LIMITS_FILE`, YAML, re-read when it changes
(looked at no more than once a second), no restart:

    team-a:                       # an identity (an API key's, the trusted header's, or anonymous)
      "*": {requests_per_minute: 600}           # every model
      tiny: {tokens_per_minute: 200000}         # one model; a field not given keeps the model's

A limit is the model set's `rate_limits` for the model, then the identity's "*" entry, then its
entry for the model, field by field; 0 is unlimited.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)
FIELDS = ("requests_per_minute", "tokens_per_minute")
ALL_MODELS = "*"
RELOAD_CHECK_S = 1.0
Limits = tuple[int, int]  # (requests_per_minute, tokens_per_minute)


def parse_overrides(data: Any, source: str) -> dict[str, dict[str, dict[str, int]]]:
    """ValueError naming the entry that is wrong."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of identity -> model -> limits")
    out: dict[str, dict[str, dict[str, int]]] = {}
    for identity, models in data.items():
        if not isinstance(models, dict):
            raise ValueError(f"{source}: {identity}: expected a mapping of model -> limits")
        for model, limits in models.items():
            where = f"{source}: {identity}.{model}"
            if not isinstance(limits, dict) or not set(limits) <= set(FIELDS):
                raise ValueError(f"{where}: expected {{requests_per_minute, tokens_per_minute}}")
            for name, value in limits.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{where}.{name}: expected a whole number >= 0")
            out.setdefault(str(identity), {})[str(model)] = dict(limits)
    return out


class RateLimitOverrides:
    def __init__(self, path: str | None = None) -> None:
        self._path = Path(path) if path else None
        self._table: dict[str, dict[str, dict[str, int]]] = {}
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        if self._path is not None:
            self._load()

    def _load(self) -> None:
        assert self._path is not None
        try:
            st = self._path.stat()
            if (st.st_mtime, st.st_size) == self._stamp:
                return
            table = parse_overrides(yaml.safe_load(self._path.read_text()), str(self._path))
        except (OSError, ValueError, yaml.YAMLError) as e:  # keep the last good table
            log.error("rate limits file not (re)loaded: %s", e)
            return
        self._table, self._stamp = table, (st.st_mtime, st.st_size)

    def limits(self, identity: str, model: str, base: Limits) -> Limits:
        if self._path is not None and (now := time.monotonic()) - self._checked >= RELOAD_CHECK_S:
            with self._lock:
                self._checked = now
                self._load()
        entry = self._table.get(identity)
        if not entry:
            return base
        values = dict(zip(FIELDS, base, strict=True))
        for scope in (ALL_MODELS, model):
            values.update(entry.get(scope, {}))
        return values["requests_per_minute"], values["tokens_per_minute"]
