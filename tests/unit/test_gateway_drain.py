"""A gateway replica scaled down drains: two HTTP servers share one port (SO_REUSEPORT) as gateway
replicas on a node do; one drains while clients open a connection per request, spread over both by
the kernel. No request may fail: the drained one finishes what it accepted, the other takes the rest.
(A SIGKILLed replica is another matter: tests/integration/test_resilience.py.)

Linux resets the connections still queued on an SO_REUSEPORT socket when it closes, unless
`net.ipv4.tcp_migrate_req` is 1 (then it hands them to another socket of the group). With it 0 a
drain under CPU load lost a request in 3 of 20 runs (two CPU burners beside it); with it 1, in none
of 12. So a client's failure is an expected failure without the setting; what the drained server
does (answer every request it took) is asserted everywhere."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import httpx
import pytest

from services.gateway.edge.http_server import ReusePortServer, migrates_queued_connections
from tests.helpers import until

CLIENTS = 8


class SlowApp:
    """20 ms a request, so that requests are in flight when the drain starts; counts the requests it
    took and those it answered in full."""

    def __init__(self) -> None:
        self.taken = self.answered = 0

    async def __call__(self, scope, receive, send) -> None:
        while (await receive())["type"] != "http.request":
            pass
        self.taken += 1
        await asyncio.sleep(0.02)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        self.answered += 1


class Clients:
    def __init__(self, url: str) -> None:
        self.url, self.served, self.failures = url, Counter[str](), list[str]()
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(CLIENTS)]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        with httpx.Client(headers={"connection": "close"}, timeout=10) as http:
            while not self._stop.is_set():
                try:
                    r = http.get(self.url)
                    r.raise_for_status()
                    with self._lock:
                        self.served[r.headers["x-mship-gateway"]] += 1
                except httpx.HTTPError as e:
                    with self._lock:
                        self.failures.append(repr(e))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)


async def test_a_drained_gateway_loses_no_request_while_another_shares_its_port():
    kept = ReusePortServer(SlowApp(), "127.0.0.1", 0, server_id="kept", drain_s=0.3)
    kept.start()
    drained_app = SlowApp()
    drained = ReusePortServer(drained_app, "127.0.0.1", kept.port, server_id="drained", drain_s=0.3)
    drained.start()
    clients = Clients(f"http://127.0.0.1:{kept.port}/")
    try:
        await until(lambda: min(clients.served["kept"], clients.served["drained"]) >= 20, "both serve",
                    timeout_s=30)
        await drained.drain_and_stop()
        served = clients.served["kept"]
        await until(lambda: clients.served["kept"] >= served + 100, "the other serves on", timeout_s=30)
    finally:
        clients.stop()
        await kept.drain_and_stop()
    assert drained_app.answered == drained_app.taken > 0  # every request it took was answered in full
    if clients.failures and not migrates_queued_connections():
        pytest.xfail(f"net.ipv4.tcp_migrate_req=0: Linux reset connections queued on the closing socket: "
                     f"{clients.failures}")
    assert clients.failures == []


class StreamApp:
    """One chunk every `every_s`, `chunks` of them: a long generation streamed."""

    def __init__(self, chunks: int, every_s: float) -> None:
        self.chunks, self.every_s = chunks, every_s
        self.started = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        while (await receive())["type"] != "http.request":
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        self.started.set()
        for i in range(self.chunks):
            await asyncio.sleep(self.every_s)
            await send({"type": "http.response.body", "body": f"{i}\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"end\n"})


async def read_stream(port: int) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        try:
            return (await http.get(f"http://127.0.0.1:{port}/")).text
        except httpx.HTTPError as e:
            return repr(e)


@pytest.mark.parametrize(("graceful_s", "whole"), [(3.0, True), (0.5, False)])
async def test_a_stopping_gateway_lets_a_stream_run_to_its_end_within_its_graceful_time(graceful_s, whole):
    """What a gateway replica Serve stops does with a stream in flight (its graceful time is
    STREAM_DRAIN_S, below): finishes it when it ends in time, cuts it at the bound otherwise."""
    app = StreamApp(chunks=10, every_s=0.1)
    server = ReusePortServer(app, "127.0.0.1", 0, drain_s=0.1, graceful_s=graceful_s)
    await server.start_here()  # on this loop, as in a replica
    reading = asyncio.ensure_future(read_stream(server.port))
    await asyncio.wait_for(app.started.wait(), 10)
    await asyncio.wait_for(server.drain_and_stop(), graceful_s + 5)
    text = await reading
    assert text.endswith("end\n") is whole, text


def test_a_gateway_replica_lets_serve_wait_for_its_streams():
    from services.gateway import deployment

    config = deployment.GatewayDeployment._deployment_config
    assert config.graceful_shutdown_timeout_s > deployment.LISTENERS_DRAIN_S + deployment.STREAM_DRAIN_S
