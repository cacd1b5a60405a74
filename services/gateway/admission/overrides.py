"""Per-identity rate-limit overrides: `MSHIP_RATE_LIMITS_FILE`, YAML, re-read when it changes
(looked at no more than once a second), no restart:

    team-a:                       # an identity (an API key's, the trusted header's, or anonymous)
      "*": {requests_per_minute: 600}           # every model
      tiny: {tokens_per_minute: 200000}         # one model; a field not given keeps the model's

A limit is the model set's `rate_limits` for the model, then the identity's "*" entry, then its
entry for the model, field by field; 0 is unlimited.
"""

from __future__ import annotations

from typing import Any

import yaml

from services.common.reloaded_file import ReloadedFile

FIELDS = ("requests_per_minute", "tokens_per_minute")
ALL_MODELS = "*"
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


def _yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: not YAML: {e}") from e


class RateLimitOverrides:
    def __init__(self, path: str | None = None) -> None:
        self._file = ReloadedFile(path, lambda text: parse_overrides(_yaml(text, path), path),
                                  {}, "rate limits file") if path else None

    def limits(self, identity: str, model: str, base: Limits) -> Limits:
        entry = self._file.value.get(identity) if self._file is not None else None
        if not entry:
            return base
        values = dict(zip(FIELDS, base, strict=True))
        for scope in (ALL_MODELS, model):
            values.update(entry.get(scope, {}))
        return values["requests_per_minute"], values["tokens_per_minute"]
