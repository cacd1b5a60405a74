"""The JSON of what the inference endpoints answer, streamed chunks and whole bodies alike: compact
UTF-8 by orjson (a chat chunk in ~0.4 µs against the standard library's ~3.3; a 16 × 384 float
embedding list in ~0.14 ms against ~2.8). Error bodies echo client input, so `errors.py` writes them
as ASCII; the rare answers of `/v1/models` and `/readyz` keep FastAPI's encoder.

orjson refuses some values the edge's parser (the standard library's) accepts and the answers echo
(a Responses tool schema, an input item's `annotations`): integers beyond 64 bits, nesting deeper
than 255 levels. Those, and only those (the fallback runs in the `except`), are written by the
standard library, to the same compact shape."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
from starlette.responses import Response

_COMPACT = (",", ":")


def encode_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON; non-string keys become strings, as with `json`."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return _encode_stdlib(obj)


def _encode_stdlib(obj: Any) -> bytes:
    """What orjson refused, by the standard library, written as orjson writes the rest."""
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=_COMPACT, allow_nan=False)
    except (ValueError, RecursionError):  # NaN or ±Infinity (orjson writes null); nesting the parser took
        text = _encode_deep(obj)          # from a shallower stack than this one
    # A lone surrogate (no UTF-8 holds one) can only sit in a string: written as its JSON escape.
    return text.encode("utf-8", "backslashreplace")


_CLOSE = object()  # marks the end of a container on `_encode_deep`'s stack
_MAX_DEPTH = 100_000  # no parsed body comes near; a circular structure stops here


def _encode_deep(obj: Any) -> str:
    """`json.dumps`'s compact output, non-finite floats as null, without recursion (any depth)."""
    out: list[str] = []
    stack: list[Any] = [obj]
    depth = 0
    while stack:
        item = stack.pop()
        if item is _CLOSE:
            depth -= 1
        elif isinstance(item, _Literal):
            out.append(item)
        elif isinstance(item, dict | list | tuple):
            depth += 1
            if depth > _MAX_DEPTH:
                raise ValueError("JSON nesting too deep (or circular)")
            parts: list[Any] = []
            if isinstance(item, dict):
                for i, (key, value) in enumerate(item.items()):
                    parts += [_Literal(("," if i else "") + json.dumps(_key(key)) + ":"), value]
                parts = [_Literal("{"), *parts, _Literal("}"), _CLOSE]
            else:
                for i, value in enumerate(item):
                    parts += [_Literal(","), value] if i else [value]
                parts = [_Literal("["), *parts, _Literal("]"), _CLOSE]
            stack.extend(reversed(parts))
        elif isinstance(item, float) and not math.isfinite(item):
            out.append("null")
        else:
            out.append(json.dumps(item, ensure_ascii=False))  # a scalar (TypeError for anything else)
    return "".join(out)


class _Literal(str):
    """Text `_encode_deep` writes as it is."""


def _key(key: Any) -> str:
    """A key as `json` writes it: strings as they are, true/false/null and numbers as their text."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, int | float):
        return json.dumps(key) if math.isfinite(key) else "null"
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


class JsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_json(content)
