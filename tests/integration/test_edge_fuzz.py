"""The edge under hostile input: hypothesis mutates valid requests of every route (wrong types,
invalid Unicode, huge numbers, NaN, deep nesting, empty strings, broken JSON, binary bodies) and
sends them to the session platform's real gateways. Every request must be answered within a few
seconds, never with a 5xx, and the gateways must serve normally afterwards. The counts are printed.

Valid bodies cap `max_tokens` low so a mutation that stays valid costs the engine little; a
mutation of `max_tokens` itself may still ask for the whole context (a few hundred ms on `tiny`).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.platform_process import PlatformProcess

pytestmark = pytest.mark.integration
EXAMPLES_PER_ROUTE = 260  # x 8 routes: >= 2,000 requests
ANSWER_WITHIN_S = 10.0
MESSAGES = [{"role": "user", "content": "Hi"}]
POST_ROUTES = {
    "/v1/chat/completions": {"model": "tiny", "messages": MESSAGES, "max_tokens": 2},
    "/v1/completions": {"model": "tiny", "prompt": "Hi", "max_tokens": 2},
    "/v1/responses": {"model": "tiny", "input": "Hi", "max_output_tokens": 16, "store": False},
    "/v1/embeddings": {"model": "tiny", "input": "Hi"},
    "/v1/responses/compact": {"model": "tiny", "input": "Hi"},
}
GET_ROUTES = ["/v1/models", "/v1/responses/{id}", "/v1/responses/{id}/input_items"]

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\ud800", "\udfff\ud800", "\x00", "\u202e", "A" * 10_000, "tiny\x00", "../../etc",
                     "%s%n", "{{7*7}}", "<|im_start|>", "<think>", "\ufeff", "🙂" * 50]),
)
hostile_number = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, -1, 2**31, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]),
)
leaf = st.one_of(st.none(), st.booleans(), hostile_number, hostile_text)
json_value = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(hostile_text, inner, max_size=4)),
                          max_leaves=12)


def deep(depth: int) -> str:
    """JSON text nested `depth` arrays deep (built as text: deeper than json.dumps can recurse)."""
    return "[" * depth + '"x"' + "]" * depth


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    """A valid body with one to three fields replaced, added or dropped, or a broken body."""
    kind = draw(st.sampled_from(["fields", "fields", "fields", "broken", "binary", "deep", "not-object"]))
    if kind == "broken":
        text = json.dumps(base)
        cut = draw(st.integers(min_value=0, max_value=len(text) - 1))
        return text[:cut].encode() + draw(st.binary(max_size=8))
    if kind == "binary":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        field = draw(st.sampled_from([*base, "metadata"]))
        rest = json.dumps({k: v for k, v in base.items() if k != field})
        return (rest[:-1] + f', "{field}": ' + deep(draw(st.sampled_from([50, 500, 5000, 100_000]))) + "}").encode()
    if kind == "not-object":
        return json.dumps(draw(json_value)).encode()
    body = dict(base)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key = draw(st.one_of(st.sampled_from([*base, "n", "stream", "tools", "temperature", "logprobs",
                                              "response_format", "stop", "seed", "dimensions",
                                              "encoding_format", "previous_response_id"]), hostile_text))
        if draw(st.booleans()) and key in body and len(body) > 1:
            del body[key]
        else:
            body[key] = draw(json_value)
    # allow_nan: NaN/Infinity literals are what a sloppy client sends (not JSON, still must be a 400)
    return json.dumps(body, allow_nan=True).encode()


@pytest.fixture(scope="module")
def edge(platform: PlatformProcess):
    counts: Counter[str] = Counter()
    with httpx.Client(base_url=platform.base_url, headers={"authorization": "Bearer key-fuzz"},
                      timeout=ANSWER_WITHIN_S) as client:
        yield client, counts
    total = sum(counts.values())
    print(f"\nfuzzed {total} requests: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    assert total >= 2000


def send(edge, method: str, path: str, content: bytes | None = None) -> None:
    client, counts = edge
    t0 = time.monotonic()
    r = client.request(method, path, content=content, headers={"content-type": "application/json"})
    elapsed = time.monotonic() - t0
    counts[f"{r.status_code}"] += 1
    assert r.status_code < 500, f"{method} {path} {content!r:.300} -> {r.status_code} {r.text[:300]}"
    assert elapsed < ANSWER_WITHIN_S
    if r.headers.get("content-type", "").startswith("application/json"):
        body = r.json()
        if r.status_code >= 400:
            assert set(body["error"]) >= {"message", "type", "param", "code"}


FUZZ = settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.mark.parametrize("path", list(POST_ROUTES))
def test_post_routes_answer_hostile_bodies_without_5xx(edge, path):
    @FUZZ
    @given(body=mutated(POST_ROUTES[path]))
    def run(body: bytes) -> None:
        send(edge, "POST", path, body)
    run()


@pytest.mark.parametrize("template", GET_ROUTES)
def test_get_routes_answer_hostile_ids_and_queries_without_5xx(edge, template):
    @FUZZ
    @given(ident=hostile_text, query=st.dictionaries(st.sampled_from(["limit", "order", "after", "stream",
                                                                     "starting_after"]), hostile_text, max_size=3))
    def run(ident: str, query: dict[str, str]) -> None:
        # percent-encoded bytes, lone surrogates included (invalid UTF-8 once decoded by the server)
        path = template.replace("{id}", quote(ident.encode("utf-8", "surrogatepass"), safe="") or "x")
        qs = urlencode(query, encoding="utf-8", errors="surrogatepass")
        send(edge, "GET", path + (f"?{qs}" if qs else ""))
    run()


def test_the_gateways_still_serve(edge, platform):
    client, _ = edge
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
