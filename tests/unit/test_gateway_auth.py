"""The edge's tenancy parts over real sockets (the gateway harness: real app, real uvicorn, real
worker servicers around the engine double): API keys (env and a reloaded file), the trusted
identity header, the cache salt derived from the identity only, CORS, request-rate limits with
OpenAI's headers, and the body bound on a chunked upload."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from services.gateway.app import GatewaySettings
from services.gateway.identity import ApiKeys, Authenticator, cache_salt_for
from tests.helpers import until
from tests.unit.gateway_harness import CHAT, MAX_BODY, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)
pytestmark = pytest.mark.timeout(60)
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(tmp_path_factory.mktemp("keys")) / "keys"
    path.write_text("# operator's keys\nkey-b:team-b\n")
    return path


@pytest.fixture(scope="module")
async def gateway(keys_file: Path) -> AsyncIterator[Gateway]:
    """This module's gateway: keys from the environment's spelling and from a file, a trusted header, CORS."""
    auth = Authenticator(ApiKeys("key-a1:team-a, key-a2:team-a", str(keys_file)), trusted_header="x-user")
    gw = Gateway(authenticator=auth, cors_origins=[ORIGIN])
    yield gw
    await gw.stop()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def salt_of(client: httpx.AsyncClient, worker, headers: dict[str, str]) -> str | None:
    reply = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert reply.status_code == 200, reply.text
    return worker.engine.renders[-1].cache_salt


async def test_a_missing_or_wrong_key_is_401_and_probes_stay_open(workers, client):
    for headers in ({}, bearer("nope"), {"x-api-key": "nope"}, {"authorization": "Basic a2V5LWExOg=="}):
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/v1/responses/x")):
            reply = await client.request(method, path, json=CHAT if method == "POST" else None, headers=headers)
            assert reply.status_code == 401, (headers, path)
            error = reply.json()["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
            assert "nope" not in error["message"]  # a presented key is never echoed
            assert reply.headers["www-authenticate"].startswith("Bearer")
    assert not any(w.engine.renders for w in workers)  # refused before any engine work
    for probe in ("/health", "/readyz"):
        assert (await client.get(probe)).status_code != 401


async def test_keys_name_identities_and_the_cache_salt_follows_the_identity_only(workers, gateway, client):
    a, _ = workers
    await gateway.route(a.address)
    a1 = await salt_of(client, a, bearer("key-a1"))
    a2 = await salt_of(client, a, {"x-api-key": "key-a2"})
    b = await salt_of(client, a, bearer("key-b"))
    assert a1 == a2 == cache_salt_for("team-a") and b == cache_salt_for("team-b") and a1 != b
    # a client cannot choose its salt: a `cache_salt` field is refused, and `prompt_cache_key` (OpenAI's
    # cache hint) is accepted without touching the salt
    reply = await client.post("/v1/chat/completions", json={**CHAT, "cache_salt": "mine"}, headers=bearer("key-b"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "cache_salt"
    hinted = await client.post("/v1/chat/completions", json={**CHAT, "prompt_cache_key": "mine"},
                               headers=bearer("key-b"))
    assert hinted.status_code == 200 and a.engine.renders[-1].cache_salt == b
    # the trusted header names the identity a proxy authenticated (configured on this gateway)
    assert await salt_of(client, a, {"x-user": "alice"}) == cache_salt_for("alice")


async def test_the_trusted_header_is_ignored_unless_configured(workers, client):
    open_gateway = Gateway()  # neither keys nor a header: everyone is the one anonymous identity
    try:
        await open_gateway.route(workers[0].address)
        async with httpx.AsyncClient(base_url=open_gateway.url, timeout=10) as c:
            for headers in ({"x-user": "alice"}, {"x-mship-identity": "team-a"}, bearer("any-string")):
                assert await salt_of(c, workers[0], headers) is None
    finally:
        await open_gateway.stop()


async def test_a_key_added_to_the_file_works_without_a_restart(workers, client, keys_file):
    assert (await client.get("/v1/models", headers=bearer("key-c"))).status_code == 401
    keys_file.write_text("key-b:team-b\nkey-c:team-c\n")

    await until_answered(client, "key-c", 200)  # the file is looked at once a second
    keys_file.write_text("key-c:team-c\n")  # a removed key stops working the same way
    await until_answered(client, "key-b", 401)


async def until_answered(client: httpx.AsyncClient, key: str, status: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (await client.get("/v1/models", headers=bearer(key))).status_code != status:
        assert time.monotonic() < deadline, f"{key} not answered {status} within {timeout_s}s"
        await asyncio.sleep(0.05)


async def test_a_websocket_without_a_key_is_refused_at_the_handshake(gateway):
    with pytest.raises(InvalidStatus) as refused:
        async with connect(gateway.url.replace("http", "ws") + "/v1/responses"):
            pass
    assert refused.value.response.status_code == 403


async def test_cors_preflight_and_origins(workers, client):
    preflight = {"origin": ORIGIN, "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type, x-stainless-os"}
    reply = await client.options("/v1/chat/completions", headers=preflight)
    assert reply.status_code == 200  # answered before authentication: a preflight carries no key
    assert reply.headers["access-control-allow-origin"] == ORIGIN
    assert reply.headers["access-control-allow-credentials"] == "true"
    assert "POST" in reply.headers["access-control-allow-methods"]
    assert "authorization" in reply.headers["access-control-allow-headers"].lower()
    refused = await client.options("/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    reply = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": ORIGIN, **bearer("key-a1")})
    assert reply.headers["access-control-allow-origin"] == ORIGIN
    assert "x-ratelimit-remaining-requests" in reply.headers["access-control-expose-headers"]
    # a 401 carries CORS headers too, so a browser client can read why
    reply = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": ORIGIN})
    assert reply.status_code == 401 and reply.headers["access-control-allow-origin"] == ORIGIN


async def test_no_credentials_with_a_wildcard_origin():
    gw = Gateway(cors_origins=["*"])
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            reply = await c.options("/v1/models", headers={"origin": "https://x.example",
                                                           "access-control-request-method": "GET"})
        assert reply.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in reply.headers
    finally:
        await gw.stop()


async def test_a_request_rate_limit_answers_429_with_openai_headers(workers, gateway, client):
    await gateway.route(*(w.address for w in workers), requests_per_minute=2)
    replies = [await client.post("/v1/chat/completions", json=CHAT, headers=bearer("key-a1")) for _ in range(3)]
    assert [r.status_code for r in replies] == [200, 200, 429]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in replies] == ["1", "0", "0"]
    assert all(r.headers["x-ratelimit-limit-requests"] == "2" for r in replies)
    refused = replies[2]
    assert int(refused.headers["retry-after"]) == 30 and refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.json()["error"]["type"] == "requests"
    # per identity, not per key: team-a's other key shares the budget; another identity has its own
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer("key-a2"))).status_code == 429
    assert (await client.post("/v1/chat/completions", json=CHAT, headers={"x-user": "bob"})).status_code == 200
    await gateway.route(*(w.address for w in workers))  # limits off again for the other tests


async def test_a_chunked_body_over_the_limit_is_413_while_reading(workers, client):
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 256 + 8):
            yield b" " * 256

    reply = await client.post("/v1/chat/completions", content=chunks(), headers=bearer("key-a1"))
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"


def _request_order(record: dict) -> tuple[bool, bool]:
    """The test's requests in the order sent: the plain one, the streamed one, the refused one."""
    return record["status"] == 401, record["streamed"]


async def test_the_audit_trail_records_each_request_without_contents_unless_asked(workers, tmp_path, monkeypatch):
    plain, full = tmp_path / "audit.jsonl", tmp_path / "audit-content.jsonl"
    auth = Authenticator(ApiKeys("key-a1:team-a"))
    quiet = Gateway(authenticator=auth, audit_log=str(plain))
    monkeypatch.setenv("MSHIP_AUDIT_CONTENT", "1")
    loud = Gateway(authenticator=auth, audit_log=str(full))
    try:
        for gw in (quiet, loud):
            await gw.route(workers[0].address)
            async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
                key = bearer("key-a1")
                ok = await c.post("/v1/chat/completions", json=CHAT, headers={**key, "x-request-id": "r-1"})
                streamed = await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=key)
                refused = await c.post("/v1/chat/completions", json=CHAT)
                await c.get("/health")  # not an API request: not audited
            assert ok.headers["x-request-id"] == "r-1" and len(streamed.headers["x-request-id"]) == 32
            assert refused.status_code == 401
        # A record is written once its response has ended, which the client may see first.
        await until(lambda: all(p.exists() and len(p.read_text().splitlines()) == 3 for p in (plain, full)),
                    "both audit logs written")
        # In the order the responses ended: a stream's record may come after the next request's.
        records = sorted((json.loads(line) for line in plain.read_text().splitlines()), key=_request_order)
        assert [(r["identity"], r["model"], r["status"], r["streamed"]) for r in records] == [
            ("team-a", "m", 200, False), ("team-a", "m", 200, True), (None, None, 401, False)]
        assert records[0]["request_id"] == "r-1" and records[0]["tokens"] == 2 + 3  # prompt + completion
        assert records[0]["client"] == "127.0.0.1" and records[0]["route"] == "/v1/chat/completions"
        assert records[0]["latency_ms"] > 0 and "request" not in records[0]
        assert "say hi" not in plain.read_text()  # no contents unless asked
        with_content = sorted((json.loads(line) for line in full.read_text().splitlines()), key=_request_order)
        assert "say hi" in with_content[0]["request"] and "Hello world!" in with_content[0]["response"]
        assert with_content[1]["streamed"] and "response" not in with_content[1]  # a stream's chunks are not kept
    finally:
        await quiet.stop()
        await loud.stop()


async def test_the_audit_trail_names_the_client_a_trusted_proxy_forwarded(tmp_path):
    """X-Forwarded-For is believed only from the proxies MSHIP_FORWARDED_ALLOW_IPS names (default
    the node itself): behind a load balancer the audit names the client, and a client that sends
    the header itself cannot name another."""
    auth = Authenticator(ApiKeys("key-a1:team-a"))
    trusting = Gateway(authenticator=auth, audit_log=str(tmp_path / "trusting.jsonl"))
    distrusting = Gateway(authenticator=auth, audit_log=str(tmp_path / "distrusting.jsonl"),
                          forwarded_allow_ips="10.0.0.0/8")
    try:
        for gw in (trusting, distrusting):
            async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
                reply = await c.get("/v1/models", headers={**bearer("key-a1"), "x-forwarded-for": "203.0.113.7"})
                assert reply.status_code == 200
        logs = [tmp_path / "trusting.jsonl", tmp_path / "distrusting.jsonl"]
        await until(lambda: all(p.exists() and p.read_text().endswith("\n") for p in logs), "both records written")
        clients = [json.loads(p.read_text())["client"] for p in logs]
        assert clients == ["203.0.113.7", "127.0.0.1"]  # the peer, 127.0.0.1, is no proxy of 10.0.0.0/8
    finally:
        await trusting.stop()
        await distrusting.stop()


@pytest.mark.parametrize(("value", "proxies"), [
    ("", "127.0.0.1,::1"), ("10.0.0.0/8, 192.168.1.5", "10.0.0.0/8,192.168.1.5"), ("*", "*"), ("fd00::/8", "fd00::/8")])
def test_the_trusted_proxies_come_from_the_environment(monkeypatch, value, proxies):
    monkeypatch.setenv("MSHIP_FORWARDED_ALLOW_IPS", value)
    assert GatewaySettings().forwarded_allow_ips == proxies


async def test_an_identity_the_store_could_not_key_is_refused(workers, client):
    reply = await client.post("/v1/chat/completions", json=CHAT, headers={"x-user": "u" * 300})
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_identity"


async def test_a_trusted_header_sent_twice_is_refused(workers, client):
    """A proxy that appends its header after the client's (Envoy's default) must not leave the
    client's value, the first one, naming the identity."""
    reply = await client.post("/v1/chat/completions", json=CHAT, headers=[("x-user", "mallory"), ("x-user", "alice")])
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_identity"


async def test_the_keys_file_caught_mid_write_or_swapped_keeps_its_keys_right(workers, tmp_path, caplog):
    """Emptied for a moment (an editor or `>` truncating it before writing): the last good keys
    stay, logged, instead of locking everyone out. Replaced by a file of the same size with the old
    mtime (`cp -p`, rsync, a rename): the revoked key stops working."""
    path = tmp_path / "keys"
    path.write_text("key-b:team-b\n")
    keys = ApiKeys("", str(path))
    gw = Gateway(authenticator=Authenticator(keys))

    async def status(key: str) -> int:
        keys._file.check_now()  # the next request looks at the file (otherwise at most once a second)
        return (await c.get("/v1/models", headers=bearer(key))).status_code

    try:
        await gw.route(workers[0].address)
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
            assert await status("key-b") == 200
            before = path.stat()
            path.write_text("key-x:team-b\n")  # key-b revoked, key-x in its place: the same size
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
            assert (await status("key-x"), await status("key-b")) == (200, 401)
            path.write_text("")
            assert await status("key-x") == 200
            assert any("keys file" in r.getMessage() and "keeping the last good one" in r.getMessage()
                       for r in caplog.records)
            path.write_text("key-y:team-y\n")  # the writer is done: the new table is read
            assert (await status("key-y"), await status("key-x")) == (200, 401)
    finally:
        await gw.stop()
