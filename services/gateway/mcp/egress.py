"""Which MCP servers the gateway may connect to: the operator's `MSHIP_MCP_ALLOWED_HOSTS`.

A request names the URL, so without a policy any caller could make the gateway open connections
inside its network. The variable is a comma-separated list of entries:

    mcp.example.com         that name, any port
    mcp.example.com:8443    that name, that port only
    *.example.com           any name under example.com (not example.com itself), any port
    *.example.com:443       ... that port only
    10.1.2.3, [fd00::1]:80  an address (a URL naming it, or a name resolving to it), optionally a port
    10.0.0.0/8, fd00::/8    any address in the network, any port
    *                       any host (a gateway whose network is walled off by other means)

Unset or empty: no MCP server is allowed. A URL's host is allowed when a name entry matches it
(whatever it resolves to, except below); else the addresses it resolves to that lie in an address
or network entry are allowed, and only those are connected to.

Always refused, even if listed: cloud metadata endpoints (169.254.169.254, fd00:ec2::254,
fd00:c1::a9fe:a9fe, 100.100.100.200, metadata.google.internal) and link-local addresses
(169.254.0.0/16, fe80::/10), also as IPv4-mapped / -compatible / NAT64 (64:ff9b::/96,
64:ff9b:1::/48) / 6to4 IPv6, and a name that resolves to
any of them (every address is checked).

DNS rebinding: the check and the connection use the same resolution. `pinned_transport()` is an
httpx2 transport whose connections resolve, check and connect in one step (`EgressBackend`), to
the checked addresses only, for every connection it opens (redirects and reconnects included); TLS
still verifies the certificate against the URL's host name. What remains: the policy trusts a
listed name's DNS answer for anything but the refused ranges (list addresses or networks, not
names, where DNS is not trusted); and no HTTP proxy is used for MCP traffic (a proxy would
connect on its own)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import httpcore2
import httpx2
import idna

from services.common.vocabulary import ENV_MCP_ALLOWED_HOSTS

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> addresses; raises socket.gaierror

METADATA_NAMES = frozenset({"metadata.google.internal"})
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "fd00:c1::a9fe:a9fe", "100.100.100.200"))
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
# NAT64: the well-known prefix and the local-use one (RFC 8215; its /96 prefixes embed the IPv4
# address in the last 32 bits); and IPv4-compatible (::a.b.c.d, deprecated, still tunnelled by some)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")
DEFAULT_PORTS = {"http": 80, "https": 443}


class EgressRefused(Exception):
    """The egress policy does not allow this MCP server. The message is safe to show the caller:
    it names the host, never a header, a resolved address or the rest of the URL."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Rule:
    name: str | None = None  # an exact host name
    suffix: str | None = None  # "*.example.com" -> ".example.com"
    network: IPNetwork | None = None
    port: int | None = None  # None: any port

    def matches_name(self, host: str, port: int) -> bool:
        if self.port not in (None, port):
            return False
        return host == self.name or (self.suffix is not None and host.endswith(self.suffix))

    def contains(self, address: IPAddress, port: int) -> bool:
        return self.network is not None and self.port in (None, port) and _unscoped(address) in self.network


# `*`: every name (each ends with ""), every address
ANY_HOST = (Rule(suffix=""), Rule(network=ipaddress.ip_network("0.0.0.0/0")),
            Rule(network=ipaddress.ip_network("::/0")))


def parse_rule(entry: str) -> Rule:
    """One entry of `MSHIP_MCP_ALLOWED_HOSTS`; ValueError if it is none of the forms above."""
    text = entry.strip().lower().rstrip(".")
    if not text.isascii():  # an internationalized name: compared in the IDNA form URLs connect with
        try:
            text = ".".join(idna.encode(label).decode("ascii") if not label.isascii() else label
                            for label in text.split("."))
        except idna.IDNAError:
            raise ValueError(f"not a host name: {entry!r}") from None
    if "/" in text:
        return Rule(network=ipaddress.ip_network(text, strict=False))
    host, port = text, None
    if text.startswith("["):
        if "]" not in text:
            raise ValueError(f"not an entry: {entry!r}")
        inside, _, rest = text[1:].partition("]")
        if _ip(inside) is None:
            raise ValueError(f"not an address in brackets: {entry!r}")
        host = inside
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"not an entry: {entry!r}")
            port = _port(rest[1:], entry)
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(port_text, entry)
    address = _ip(host)
    if address is not None:
        return Rule(network=ipaddress.ip_network(address), port=port)
    if host.startswith("*."):
        if not _NAME.match(host[2:]):
            raise ValueError(f"not a host name: {entry!r}")
        return Rule(suffix=host[1:], port=port)
    if not _NAME.match(host):
        raise ValueError(f"not a host name, address or network: {entry!r}")
    return Rule(name=host, port=port)


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"not a port in {entry!r}")
    return int(text)


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _embedded_v4(address: IPAddress) -> IPAddress | None:
    """The IPv4 address an IPv6 one stands for (mapped, NAT64, 6to4), which a router may reach."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if any(address in net for net in _NAT64) or (address in _V4_COMPATIBLE and int(address) > 0xFFFF):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _unscoped(address: IPAddress) -> IPAddress:
    """fe80::1%eth0 -> fe80::1: a scoped address compares unequal to its plain spelling."""
    return ipaddress.IPv6Address(int(address)) if isinstance(address, ipaddress.IPv6Address) else address


def always_refused(address: IPAddress) -> bool:
    """A cloud metadata endpoint or a link-local address, in any of its spellings."""
    plain = _unscoped(address)
    for a in (plain, _embedded_v4(plain)):
        if a is not None and (a in METADATA_ADDRESSES or any(a in net for net in LINK_LOCAL)):
            return True
    return False


@dataclass(frozen=True)
class EgressPolicy:
    rules: tuple[Rule, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def parse(cls, text: str | None, resolver: Resolver | None = None, strict: bool = True) -> EgressPolicy:
        """The policy of a `MSHIP_MCP_ALLOWED_HOSTS` value. Not strict: a bad entry allows nothing
        and is logged (once per value); strict: ValueError."""
        rules, bad = [], []
        for entry in (text or "").split(","):
            if not entry.strip():
                continue
            if entry.strip() == "*":
                rules += ANY_HOST
                continue
            try:
                rules.append(parse_rule(entry))
            except ValueError as e:
                if strict:
                    raise ValueError(f"{ENV_MCP_ALLOWED_HOSTS}: {e}") from None
                bad.append(entry.strip())
        if bad:
            log.warning("%s: ignoring entries that are no host name, address or network: %s",
                        ENV_MCP_ALLOWED_HOSTS, ", ".join(bad))
        return cls(tuple(rules), resolver or system_resolver)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EgressPolicy:
        return _from_text((os.environ if environ is None else environ).get(ENV_MCP_ALLOWED_HOSTS, ""))

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses a connection to host:port may use, checked; EgressRefused if none may.
        socket.gaierror when the name does not resolve."""
        name = host.strip().lower().rstrip(".").strip("[]")
        shown = f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
        if not self.rules:
            raise EgressRefused(f"MCP server {shown} is not allowed: {ENV_MCP_ALLOWED_HOSTS} is empty on this "
                                "gateway, so it connects to no MCP server. An operator lists the allowed hosts "
                                "there.")
        literal = _ip(name)
        if literal is None and name in METADATA_NAMES:
            raise _refused_always(shown)
        by_name = literal is None and any(r.matches_name(name, port) for r in self.rules)
        if not by_name and not any(r.network is not None and r.port in (None, port) for r in self.rules):
            raise _not_listed(shown)  # decided without a DNS query
        found = [literal] if literal is not None else [_ip(a) for a in await self.resolver(name, port)]
        addresses = list(dict.fromkeys(a for a in found if a is not None))
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{name} has no address")
        if any(always_refused(a) for a in addresses):
            raise _refused_always(shown)
        if not by_name:
            addresses = [a for a in addresses if any(r.contains(a, port) for r in self.rules)]
            if not addresses:
                raise _not_listed(shown)
        return [str(a) for a in addresses]


@lru_cache(maxsize=8)
def _from_text(text: str) -> EgressPolicy:
    return EgressPolicy.parse(text, strict=False)


def _refused_always(shown: str) -> EgressRefused:
    return EgressRefused(f"MCP server {shown} is refused: it is or resolves to a cloud metadata endpoint or a "
                         f"link-local address, which no MCP server may be (whatever {ENV_MCP_ALLOWED_HOSTS} "
                         "allows).")


def _not_listed(shown: str) -> EgressRefused:
    return EgressRefused(f"MCP server {shown} is not allowed: it is not in this gateway's {ENV_MCP_ALLOWED_HOSTS}.")


def url_host_port(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL, as httpx2 (the connection) parses it; EgressRefused for any
    other URL."""
    try:
        parsed = httpx2.URL(url)
    except (httpx2.InvalidURL, TypeError, ValueError):
        raise EgressRefused("The MCP server URL is not a valid URL.") from None
    if parsed.scheme not in DEFAULT_PORTS or not parsed.host:
        raise EgressRefused("The MCP server URL must be an http:// or https:// URL.")
    # raw_host: the IDNA (ASCII) form, as the connection sees it
    return parsed.raw_host.decode("ascii"), parsed.port or DEFAULT_PORTS[parsed.scheme]


async def check_url(url: str, policy: EgressPolicy | None = None) -> None:
    """EgressRefused unless the policy (default: the environment's) allows connecting to `url`;
    socket.gaierror when its host does not resolve. A check ahead of connecting, for a clear
    error: the connection itself checks again (`pinned_transport`)."""
    host, port = url_host_port(url)
    await (policy or EgressPolicy.from_env()).resolve(host, port)


class EgressBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend, resolving through the policy: every TCP connection goes to an
    address checked in the same step, so DNS cannot answer differently between check and connect."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy
        self._backend = httpcore2.AnyIOBackend()

    # The signatures are httpcore2's interface (hence `timeout`).
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,  # noqa: ASYNC109
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await self.policy.resolve(host, port)
        except socket.gaierror as e:
            raise httpcore2.ConnectError(f"cannot resolve {host}: {e.strerror or e}") from e
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._backend.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                       socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as e:
                failure = e
        assert failure is not None
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None,  # noqa: ASYNC109
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("MCP servers are reached over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


@lru_cache(maxsize=1)
def _default_ssl_context() -> ssl.SSLContext:
    return httpx2.create_ssl_context()  # ~45 ms to build: once per process, not per MCP call


class _PinnedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, policy: EgressPolicy, verify: Any = True) -> None:
        context = _default_ssl_context() if verify is True else httpx2.create_ssl_context(verify=verify)
        super().__init__(verify=context)
        # httpx2 offers no network-backend option: swap the pool it built (unused yet) for one on
        # the policy's backend. tests/unit/test_mcp_egress.py proves connections take this path.
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=context, max_connections=16, keepalive_expiry=5.0,
                                                   network_backend=EgressBackend(policy))


def pinned_transport(policy: EgressPolicy | None = None, verify: Any = True) -> httpx2.AsyncBaseTransport:
    """An httpx2 transport that connects only where the policy allows (see the module doc). Use it
    with `httpx2.AsyncClient(transport=..., trust_env=False)`: no proxy, no .netrc."""
    return _PinnedTransport(policy or EgressPolicy.from_env(), verify)
