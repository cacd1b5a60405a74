"""Fixtures over the gateway harness (tests/unit/gateway_harness.py), loaded by a test module with
`pytest_plugins = ("tests.unit.gateway_fixtures",)`: the module's gateway, two routed worker
replicas per test (afterwards nothing may still hold a request), clients, and (`responses`) the
Responses API over a memory state service."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from services.gateway.responses.compaction import CompactionCodec
from services.gateway.responses.router import enable_responses
from services.gateway.responses.serving import ResponsesServing
from services.state.client import StateClient
from services.state.deployment import start_state_server
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.unit.gateway_harness import SCRIPT, Gateway


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway()
    yield gw
    await gw.stop()


@pytest.fixture
def max_model_len() -> int:
    """The workers' context length (a module overrides this fixture for longer prompts)."""
    return 64


@pytest.fixture
async def workers(gateway: Gateway, max_model_len: int) -> AsyncIterator[tuple[ServedWorker, ServedWorker]]:
    """Two live replicas of MODEL, routed; afterwards nothing may still hold a request."""
    a, b = [await serve_worker(ScriptedEngine(SCRIPT, max_model_len=max_model_len)) for _ in range(2)]
    await gateway.route(a.address, b.address)
    try:
        yield a, b
        await until(lambda: gateway.http.inflight == 0, "the edge to finish its requests")
        await until(lambda: all(e.outstanding == 0 for r in gateway.table.routes.values() for e in r.endpoints),
                    "the picker's outstanding counts to return to 0")
        await until(lambda: not a.servicer.inflight and not b.servicer.inflight, "the workers to finish")
    finally:
        for w in (a, b):
            w.engine.hold.set()
            w.engine.first_hold.set()
            await w.server.stop(0)


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


@pytest.fixture
async def oai(gateway: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-test", max_retries=0,
                                  timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
async def responses(gateway: Gateway) -> AsyncIterator[ResponsesServing]:
    """The Responses API enabled on the module's gateway, over a memory state service."""
    server, port = await start_state_server("memory://", "127.0.0.1", 0, sweep_interval_s=None)

    def enable() -> ResponsesServing:  # on the server's loop: the state client's channel lives there
        serving = ResponsesServing(gateway.table, StateClient(f"127.0.0.1:{port}"), "gw-test", CompactionCodec())
        enable_responses(gateway.app, serving)
        return serving
    serving = await gateway.on_loop(enable)
    yield serving
    await gateway.on_loop(lambda: enable_responses(gateway.app, None))
    await server.stop(0)
