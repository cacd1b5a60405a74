"""`services.gateway.mcp.egress`: `MSHIP_MCP_ALLOWED_HOSTS` and what is refused whatever it says.
Test hosts are 127.0.0.1 and localhost; other names go through a fake resolver, never real DNS."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from ipaddress import ip_network
from pathlib import Path

import httpx2
import pytest

from services.common.vocabulary import ENV_MCP_ALLOWED_HOSTS, PLATFORM_ENV
from services.gateway.mcp.egress import (
    EgressPolicy,
    EgressRefused,
    Rule,
    always_refused,
    check_url,
    parse_rule,
    pinned_transport,
)


class FakeDns:
    """Answers from a table (a list: one answer per query, in turn), and counts queries."""

    def __init__(self, table: dict[str, list[str] | list[list[str]]]) -> None:
        self.table, self.queries = table, []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.queries.append(host)
        answer = self.table.get(host)
        if answer is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if answer and isinstance(answer[0], list):
            return list(answer.pop(0))  # type: ignore[arg-type]
        return list(answer)  # type: ignore[arg-type]


def policy(text: str, dns: FakeDns | None = None) -> EgressPolicy:
    return EgressPolicy.parse(text, resolver=dns)


async def allowed(p: EgressPolicy, url: str) -> bool:
    try:
        await check_url(url, p)
    except EgressRefused:
        return False
    return True


def test_constant_reaches_gateway_replicas() -> None:
    assert ENV_MCP_ALLOWED_HOSTS == "MSHIP_MCP_ALLOWED_HOSTS" and ENV_MCP_ALLOWED_HOSTS in PLATFORM_ENV


@pytest.mark.parametrize(("entry", "rule"), [
    ("localhost", Rule(name="localhost")),
    (" LocalHost. ", Rule(name="localhost")),
    ("localhost:8080", Rule(name="localhost", port=8080)),
    ("*.example.com", Rule(suffix=".example.com")),
    ("*.example.com:443", Rule(suffix=".example.com", port=443)),
    ("127.0.0.1", Rule(network=ip_network("127.0.0.1/32"))),
    ("127.0.0.1:9000", Rule(network=ip_network("127.0.0.1/32"), port=9000)),
    ("10.0.0.0/8", Rule(network=ip_network("10.0.0.0/8"))),
    ("::1", Rule(network=ip_network("::1/128"))),
    ("[::1]:8080", Rule(network=ip_network("::1/128"), port=8080)),
    ("fd00::/8", Rule(network=ip_network("fd00::/8"))),
])
def test_entries(entry: str, rule: Rule) -> None:
    assert parse_rule(entry) == rule


@pytest.mark.parametrize("entry", ["*", "localhost:0", "localhost:http", "a b", "10.0.0.0/33", "[::1", "[mcp.test]:80",
                                   "*.", "-bad-.example", "http://x.example"])
def test_bad_entries(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_rule(entry)


def test_lenient_parse_keeps_the_good_entries(caplog: pytest.LogCaptureFixture) -> None:
    p = EgressPolicy.parse("localhost, not a host, 127.0.0.1", strict=False)
    assert len(p.rules) == 2 and "not a host" in caplog.text
    with pytest.raises(ValueError, match=ENV_MCP_ALLOWED_HOSTS):
        EgressPolicy.parse("localhost, not a host")


async def test_unset_or_empty_allows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_MCP_ALLOWED_HOSTS, raising=False)
    with pytest.raises(EgressRefused, match=f"{ENV_MCP_ALLOWED_HOSTS} is empty"):
        await check_url("http://127.0.0.1:8000/mcp")
    monkeypatch.setenv(ENV_MCP_ALLOWED_HOSTS, " , ")
    assert not await allowed(EgressPolicy.from_env(), "http://localhost/mcp")
    monkeypatch.setenv(ENV_MCP_ALLOWED_HOSTS, "localhost")
    assert await allowed(EgressPolicy.from_env(), "http://localhost/mcp")  # read per call, not at import


async def test_names_and_ports() -> None:
    p = policy("localhost:8080")
    assert await allowed(p, "http://localhost:8080/mcp")
    assert not await allowed(p, "http://localhost:8081/mcp")
    assert not await allowed(p, "http://localhost/mcp")  # :80
    assert not await allowed(p, "http://127.0.0.1:8080/mcp")  # a name entry does not allow its address
    assert await allowed(policy("127.0.0.1"), "http://127.0.0.1:1234/mcp")
    # an address entry allows the address, also under a name that resolves to it
    assert await allowed(policy("127.0.0.1", FakeDns({"localhost": ["127.0.0.1"]})), "http://localhost:81/")
    assert await allowed(policy("localhost"), "http://LOCALHOST.:9/x")  # case, trailing dot


async def test_https_default_port() -> None:
    assert await allowed(policy("localhost:443"), "https://localhost/mcp")
    assert not await allowed(policy("localhost:443"), "http://localhost/mcp")


async def test_wildcards() -> None:
    dns = FakeDns({"mcp.example.com": ["127.0.0.1"], "a.b.example.com": ["127.0.0.1"], "example.com": ["127.0.0.1"],
                   "badexample.com": ["127.0.0.1"]})
    p = policy("*.example.com", dns)
    assert await allowed(p, "https://mcp.example.com/")
    assert await allowed(p, "https://a.b.example.com/")
    assert not await allowed(p, "https://example.com/")
    assert not await allowed(p, "https://badexample.com/")
    assert not await allowed(policy("*.example.com:8443", dns), "https://mcp.example.com/")


async def test_a_star_allows_every_host_but_never_the_refused_ones() -> None:
    dns = FakeDns({"mcp.example.com": ["192.0.2.1"], "evil.test": ["169.254.169.254"]})
    p = policy("*", dns)
    assert await allowed(p, "https://mcp.example.com:8443/mcp")
    assert await allowed(p, "http://10.1.2.3/") and await allowed(p, "http://[::1]:8080/")
    for url in ("http://169.254.169.254/", "http://evil.test/", "http://metadata.google.internal/"):
        with pytest.raises(EgressRefused):
            await check_url(url, p)


async def test_unlisted_name_is_refused_without_a_dns_query() -> None:
    dns = FakeDns({"other.test": ["127.0.0.1"]})
    with pytest.raises(EgressRefused, match="not in this gateway's MSHIP_MCP_ALLOWED_HOSTS"):
        await check_url("http://other.test/", policy("localhost", dns))
    assert dns.queries == []


async def test_networks_match_resolved_addresses() -> None:
    dns = FakeDns({"inside.test": ["10.1.2.3"], "outside.test": ["192.0.2.1"], "split.test": ["192.0.2.1", "10.9.9.9"]})
    p = policy("10.0.0.0/8", dns)
    assert await allowed(p, "http://inside.test/")
    assert await allowed(p, "http://10.200.0.1:8080/")
    assert not await allowed(p, "http://outside.test/")
    assert await p.resolve("split.test", 80) == ["10.9.9.9"]  # only the listed address is used
    assert not await allowed(policy("127.0.0.1:9", dns), "http://127.0.0.1:10/")


async def test_ipv6_literals() -> None:
    p = policy("[::1]:8080")
    assert await allowed(p, "http://[::1]:8080/mcp")
    assert not await allowed(p, "http://[::1]:8081/mcp")


async def test_unresolvable_is_a_dns_error_not_a_refusal() -> None:
    with pytest.raises(socket.gaierror):
        await check_url("http://gone.test/", policy("gone.test", FakeDns({})))


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://100.100.100.200/",
    "http://metadata.google.internal/computeMetadata/v1/", "http://169.254.1.1:8080/", "http://[fe80::1]/",
    "http://[::ffff:169.254.169.254]/", "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::1]/",
    "http://[64:ff9b:1::a9fe:a9fe]/", "http://[::a9fe:a9fe]/",  # local-use NAT64, IPv4-compatible
    "http://2852039166/",  # 169.254.169.254 as one number: getaddrinfo reads it so
])
async def test_metadata_and_link_local_are_refused_even_if_listed(url: str) -> None:
    listed = policy("169.254.169.254,169.254.0.0/16,fe80::/10,metadata.google.internal,100.100.100.200,"
                    "fd00:ec2::254,0.0.0.0/0,::/0,2852039166", FakeDns({"metadata.google.internal": ["10.0.0.1"]}))
    if url == "http://2852039166/":
        listed = EgressPolicy.parse("0.0.0.0/0")  # the system resolver
    with pytest.raises(EgressRefused, match="cloud metadata endpoint or a link-local address"):
        await check_url(url, listed)


async def test_a_listed_name_resolving_to_metadata_is_refused() -> None:
    dns = FakeDns({"evil.test": ["127.0.0.1", "169.254.169.254"], "evil6.test": ["fe80::1%1"]})
    for host in ("evil.test", "evil6.test"):
        with pytest.raises(EgressRefused, match="resolves to a cloud metadata"):
            await check_url(f"http://{host}/", policy("evil.test,evil6.test", dns))


def test_always_refused_spellings() -> None:
    for a in ("169.254.169.254", "169.254.0.1", "fe80::abcd", "::ffff:169.254.169.254", "fd00:ec2::254",
              "100.100.100.200", "fd00:c1::a9fe:a9fe"):
        assert always_refused(ipaddress.ip_address(a)), a
    for a in ("127.0.0.1", "10.0.0.1", "::1", "100.100.100.201", "::", "64:ff9b:1::7f00:1"):
        assert not always_refused(ipaddress.ip_address(a)), a


@pytest.mark.parametrize("url", ["ftp://localhost/", "localhost:8080", "http:///nohost", "unix:///var/run/x.sock"])
async def test_only_http_urls(url: str) -> None:
    with pytest.raises(EgressRefused):
        await check_url(url, policy("localhost"))


async def test_refusal_names_the_variable_and_host_only() -> None:
    url = "http://localhost:9/mcp/secret-path?key=s3cr3t"
    with pytest.raises(EgressRefused) as info:
        await check_url(url, policy("127.0.0.1:10"))
    assert ENV_MCP_ALLOWED_HOSTS in str(info.value) and "localhost:9" in str(info.value)
    assert "s3cr3t" not in str(info.value) and "secret-path" not in str(info.value)


# ---- the pinned transport: check and connect in one step -------------------------------------------------


def serve_http(tls: ssl.SSLContext | None = None) -> tuple[int, list[str], Callable[[], None]]:
    """A one-line HTTP(S) server on 127.0.0.1 in a thread: (port, Host headers seen, stop)."""
    seen: list[str] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                conn.settimeout(5)
                if tls is not None:
                    conn = tls.wrap_socket(conn, server_side=True)
            except OSError:  # no connection yet, or a TLS handshake the client gave up
                continue
            with conn:
                request = conn.recv(65536).decode("latin-1")
                seen.extend(line.split(":", 1)[1].strip() for line in request.split("\r\n")
                            if line.lower().startswith("host:"))
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(2)
        listener.close()

    return listener.getsockname()[1], seen, close


@pytest.fixture
def http_server() -> Iterator[tuple[int, list[str]]]:
    port, seen, close = serve_http()
    yield port, seen
    close()


def self_signed(tmp_path: Path, host: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting it) for a certificate naming `host`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    return server, ssl.create_default_context(cafile=str(cert_file))


async def test_transport_connects_to_the_checked_address(http_server: tuple[int, list[str]]) -> None:
    port, seen = http_server
    dns = FakeDns({"mcp.test": ["127.0.0.1"]})  # not a real name: only the policy's answer reaches it
    async with httpx2.AsyncClient(transport=pinned_transport(policy("mcp.test", dns)), trust_env=False) as http:
        response = await http.get(f"http://mcp.test:{port}/mcp")
    assert response.text == "ok" and seen == [f"mcp.test:{port}"] and dns.queries == ["mcp.test"]


async def test_transport_refuses_a_rebound_name(http_server: tuple[int, list[str]]) -> None:
    port, seen = http_server
    # The first answer passes the check ahead of connecting; the connection's own answer is metadata.
    dns = FakeDns({"rebind.test": [["127.0.0.1"], ["169.254.169.254"]]})
    p = policy("rebind.test", dns)
    await check_url(f"http://rebind.test:{port}/", p)
    async with httpx2.AsyncClient(transport=pinned_transport(p), trust_env=False) as http:
        with pytest.raises(EgressRefused):
            await http.get(f"http://rebind.test:{port}/")
    assert seen == [] and len(dns.queries) == 2


async def test_transport_refuses_what_the_policy_refuses(http_server: tuple[int, list[str]]) -> None:
    port, seen = http_server
    async with httpx2.AsyncClient(transport=pinned_transport(policy("localhost:1")), trust_env=False) as http:
        with pytest.raises(EgressRefused):
            await http.get(f"http://127.0.0.1:{port}/")
    assert seen == []


async def test_tls_still_verifies_the_name_when_pinned(tmp_path: Path) -> None:
    server_tls, trusting = self_signed(tmp_path, "mcp.test")
    port, seen, close = serve_http(server_tls)
    try:
        dns = FakeDns({"mcp.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
        p = policy("mcp.test,other.test", dns)
        async with httpx2.AsyncClient(transport=pinned_transport(p, verify=trusting), trust_env=False) as http:
            assert (await http.get(f"https://mcp.test:{port}/")).text == "ok"  # the certificate's name
            with pytest.raises(httpx2.ConnectError, match="certificate"):
                await http.get(f"https://other.test:{port}/")  # same address, a name the certificate lacks
        assert seen == [f"mcp.test:{port}"]
    finally:
        close()
