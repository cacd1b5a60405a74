"""Who is calling: an API key's identity, a trusted proxy's header, or the one anonymous identity.

- API keys: `MSHIP_API_KEYS` (`key:identity,...`) and/or `MSHIP_API_KEYS_FILE` (one `key:identity`
  a line, `#` comments), presented as `Authorization: Bearer KEY` or `x-api-key: KEY`. The file is
  re-read within a second of a change, without a restart (a SIGHUP sent after editing it never
  stops a gateway: services/common/sighup.py).
  Keys are held and looked up as SHA-256 digests: how long a lookup takes says nothing about how
  much of a guess matched (the timing attack a byte-wise `==` on keys allows). Keys are never logged.
- A trusted header (`MSHIP_TRUSTED_IDENTITY_HEADER=x-user`) names the identity a proxy in front
  authenticated. It is honoured only when configured: where clients reach the gateway directly it
  would let anyone pick a tenant. Sent more than once, it is refused (401): a proxy that appends
  its value after the client's must not leave the client's first.
- With neither, every caller is ANONYMOUS (one identity, one prefix cache, rate-limited per client
  address, an IPv6 client's /64); a bearer string is then ignored, not turned into an identity
  anyone could pick.

The identity scopes stored responses and background runs, salts the prefix cache, keys the rate
limits, and travels to the workers in gRPC metadata (`IDENTITY_METADATA`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from services.common.reloaded_file import ReloadedFile
from services.common.vocabulary import (
    ENV_API_KEYS,
    ENV_API_KEYS_FILE,
    ENV_TRUST_IDENTITY_HEADER,
    ENV_TRUSTED_IDENTITY_HEADER,
)
from services.gateway.protocol_common.openai_error import OpenAIError

log = logging.getLogger(__name__)
ANONYMOUS = "anonymous"
LEGACY_IDENTITY_HEADER = "x-mship-identity"  # MSHIP_TRUST_IDENTITY_HEADER=1 names this one
IDENTITY_METADATA = "mship-identity-bin"
MAX_IDENTITY_BYTES = 256  # the state service keys responses by identity (at most 512 bytes a part)


@dataclass
class Caller:
    """One request's caller. `response_headers` collects what the edge adds to the answer
    (the rate-limit headers); `model` and `used_tokens` are what the audit trail records."""

    identity: str
    client: str = ""
    anonymous: bool = False
    response_headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None        # set on admission (for the audit trail)
    used_tokens: int | None = None  # set when its worker call is settled, if the audit trail counts

    @property
    def rate_key(self) -> str:
        """Whose budget a request spends: the identity, or the client address when anonymous (an
        IPv6 client's /64: one host holds a whole /64, and a budget per address would be endless)."""
        return f"{ANONYMOUS}@{client_network(self.client)}" if self.anonymous else self.identity


def client_network(host: str) -> str:
    """An IPv4 address (an IPv4-mapped IPv6 one too) as it is; an IPv6 address as its /64."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(text: str, source: str, separator: str) -> dict[bytes, str]:
    """`key:identity` entries split by `separator`; ValueError naming the entry's position (never the key)."""
    out: dict[bytes, str] = {}
    for n, raw in enumerate(text.split(separator), 1):
        entry = raw.split("#", 1)[0].strip() if separator == "\n" else raw.strip()
        if not entry:
            continue
        key, sep, identity = entry.rpartition(":")
        if not sep or not key.strip() or not identity.strip():
            raise ValueError(f"{source}: entry {n} is not key:identity")
        if len(identity.strip().encode()) > MAX_IDENTITY_BYTES:
            raise ValueError(f"{source}: entry {n}: the identity is longer than {MAX_IDENTITY_BYTES} bytes")
        out[_digest(key.strip())] = identity.strip()
    return out


class ApiKeys:
    """The key -> identity table, from the environment and an optional file kept fresh."""

    def __init__(self, inline: str = "", path: str | None = None) -> None:
        self._inline = parse_keys(inline, ENV_API_KEYS, ",")
        self._file = ReloadedFile(path, lambda text: parse_keys(text, path, "\n"), {}, "API keys file") \
            if path else None

    @property
    def configured(self) -> bool:
        return bool(self._inline) or self._file is not None

    def identity_of(self, key: str) -> str | None:
        digest = _digest(key)
        return self._inline.get(digest) or (self._file.value.get(digest) if self._file is not None else None)


def invalid_api_key(missing: bool) -> OpenAIError:
    message = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
               "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY) or in an x-api-key header."
               if missing else "Incorrect API key provided.")
    return OpenAIError(401, message, code="invalid_api_key")


class Authenticator:
    def __init__(self, keys: ApiKeys | None = None, trusted_header: str | None = None) -> None:
        self.keys = keys if keys is not None and keys.configured else None
        self.trusted_header = trusted_header.lower() if trusted_header else None

    @classmethod
    def from_env(cls) -> Authenticator:
        header = os.environ.get(ENV_TRUSTED_IDENTITY_HEADER) or (
            LEGACY_IDENTITY_HEADER if os.environ.get(ENV_TRUST_IDENTITY_HEADER) == "1" else None)
        return cls(ApiKeys(os.environ.get(ENV_API_KEYS, ""), os.environ.get(ENV_API_KEYS_FILE) or None), header)

    @property
    def open(self) -> bool:
        """Neither keys nor a trusted header: every caller is anonymous."""
        return self.keys is None and self.trusted_header is None

    def authenticate(self, conn: HTTPConnection) -> Caller:
        """The caller, or OpenAIError 401."""
        client = conn.client.host if conn.client else ""
        if self.open:
            return Caller(ANONYMOUS, client, anonymous=True)
        if self.trusted_header and (value := conn.headers.get(self.trusted_header, "").strip()):
            if len(conn.headers.getlist(self.trusted_header)) > 1:
                # a proxy that adds its header after the client's (appends, not replaces) would
                # otherwise let the client's own value, the first one, pick the identity
                raise OpenAIError(401, f"The identity header {self.trusted_header} was sent more than once.",
                                  code="invalid_identity")
            if len(value.encode()) > MAX_IDENTITY_BYTES:
                raise OpenAIError(401, f"The identity header is longer than {MAX_IDENTITY_BYTES} bytes.",
                                  code="invalid_identity")
            return Caller(value, client)
        key = presented_key(conn)
        if self.keys is None:  # only a trusted header is configured, and it is missing
            raise invalid_api_key(missing=True)
        if not key:
            raise invalid_api_key(missing=True)
        identity = self.keys.identity_of(key)
        if identity is None:
            raise invalid_api_key(missing=False)
        return Caller(identity, client)


def presented_key(conn: HTTPConnection) -> str:
    auth = conn.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return conn.headers.get("x-api-key", "").strip()


def caller_of(conn: HTTPConnection) -> Caller:
    """The caller the edge's auth middleware authenticated for this request."""
    return conn.scope["state"]["caller"]


def cache_salt_for(identity: str) -> str | None:
    """Derived from the identity only, never from client input. None for the anonymous identity:
    anonymous callers share one cache, as with a plain engine."""
    if identity == ANONYMOUS:
        return None
    return hashlib.sha256(b"mship-cache-salt:" + identity.encode()).hexdigest()[:32]
