"""Caller identity: from an API key or a trusted header set by the layer in front.

It scopes stored responses and salts the prefix cache, so one tenant's cached prompt blocks
never serve another's.
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request

IDENTITY_HEADER = "x-mship-identity"
ANONYMOUS = "anonymous"


def identity_of(request: Request, trust_header: bool = True) -> str:
    if trust_header and (value := request.headers.get(IDENTITY_HEADER)):
        return value.strip()
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return "key:" + hashlib.sha256(auth[7:].strip().encode()).hexdigest()[:32]
    return ANONYMOUS


def cache_salt_for(identity: str) -> str | None:
    """None for anonymous callers: they share one cache, as with a plain engine."""
    if identity == ANONYMOUS:
        return None
    return hashlib.sha256(b"mship-cache-salt:" + identity.encode()).hexdigest()[:32]
