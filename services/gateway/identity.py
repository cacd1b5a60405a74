"""Caller identity: from an API key, or from a header set by a trusted layer in front.

It scopes stored responses and salts the prefix cache, so one tenant's cached prompt blocks
never serve another's. The header is honoured only when MSHIP_TRUST_IDENTITY_HEADER=1: where
clients can reach the gateway directly, it would let anyone pick a tenant.
"""

from __future__ import annotations

import hashlib
import os

from starlette.requests import HTTPConnection

from services.common.vocabulary import ENV_TRUST_IDENTITY_HEADER

IDENTITY_HEADER = "x-mship-identity"
ANONYMOUS = "anonymous"


def identity_of(request: HTTPConnection, trust_header: bool | None = None) -> str:
    if trust_header is None:
        trust_header = os.environ.get(ENV_TRUST_IDENTITY_HEADER) == "1"
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
