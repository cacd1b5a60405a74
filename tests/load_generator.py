"""Clients that hammer the gateway while something happens (a deploy, a restart, a rescale).

Each client thread sends chat requests back to back on its own connection, alternating streamed
and non-streamed; every request that does not end well (a non-200 status, a stream without
`[DONE]` or with an error chunk, a transport error) is recorded as a failure. Used by the
integration tests (assert no failure) and by bench/cutover.py (latency percentiles).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Sample:
    started: float  # time.monotonic()
    latency_s: float
    streamed: bool
    server: str = ""  # the gateway replica that answered (x-mship-gateway)


@dataclass(frozen=True)
class Failure:
    started: float
    ended: float
    error: str
    client: int = 0  # which client thread sent it (each sends one request at a time)


class LoadGenerator:
    def __init__(self, base_url: str, model: str, clients: int = 4, max_tokens: int = 8,
                 prompt: str = "What is 2 + 2?", headers: dict[str, str] | None = None, timeout_s: float = 120,
                 fresh_connections: bool = False, distinct_prompts: bool = False) -> None:
        """`fresh_connections`: a new connection per request (`Connection: close`), as many separate
        clients would make: the kernel spreads them over the gateway replicas. `distinct_prompts`:
        each request's message is its own (numbered), as many users' are: prefix-affinity routing
        then spreads them over a model's replicas instead of keeping one prompt on one replica."""
        self.base_url, self.headers, self.timeout_s = base_url, dict(headers or {}), timeout_s
        if fresh_connections:
            self.headers["connection"] = "close"
        self.body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]}
        self._numbered = itertools.count() if distinct_prompts else None
        self.samples: list[Sample] = []
        self.failures: list[str] = []
        self.failed: list[Failure] = []  # the same, with when each failed request started and ended
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i, i % 2 == 1), daemon=True, name=f"load-{i}")
                         for i in range(clients)]

    @property
    def ok(self) -> int:
        return len(self.samples)

    def _loop(self, client: int, streamed: bool) -> None:
        with httpx.Client(base_url=self.base_url, timeout=self.timeout_s, headers=self.headers) as http:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    error, server, retry_after = self._stream(http) if streamed else self._request(http)
                except httpx.HTTPError as e:
                    error, server, retry_after = repr(e), "", 0.0
                with self._lock:
                    if error:
                        self.failures.append(f"{'stream' if streamed else 'request'}: {error}")
                        self.failed.append(Failure(t0, time.monotonic(), self.failures[-1], client))
                    else:
                        self.samples.append(Sample(t0, time.monotonic() - t0, streamed, server))
                streamed = not streamed
                self._stop.wait(retry_after)  # as the OpenAI SDK does before it sends again

    def _next_body(self) -> dict:
        if self._numbered is None:
            return self.body
        (message,) = self.body["messages"]
        return {**self.body, "messages": [{**message, "content": f"{message['content']} (#{next(self._numbered)})"}]}

    def _request(self, http: httpx.Client) -> tuple[str, str, float]:
        """(error or "", the answering gateway replica, the Retry-After to honour)"""
        r = http.post("/v1/chat/completions", json=self._next_body())
        if r.status_code != 200 or not r.json()["choices"]:
            return f"{r.status_code} {r.text[:300]}", "", _retry_after(r)
        return "", r.headers.get("x-mship-gateway", ""), 0.0

    def _stream(self, http: httpx.Client) -> tuple[str, str, float]:
        with http.stream("POST", "/v1/chat/completions", json={**self._next_body(), "stream": True}) as r:
            if r.status_code != 200:
                return f"{r.status_code} {r.read().decode(errors='replace')[:300]}", "", _retry_after(r)
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            server = r.headers.get("x-mship-gateway", "")
        if not lines or lines[-1] != "data: [DONE]":
            return f"stream ended without [DONE]: {lines[-2:]}", "", 0.0
        errors = [line for line in lines if '"error"' in line]
        return (f"error chunk in stream: {errors[0]}" if errors else ""), server, 0.0

    def wait_for(self, n: int, timeout_s: float = 120) -> None:
        """Until `n` more requests have succeeded than now (the load really flows)."""
        target, deadline = self.ok + n, time.monotonic() + timeout_s
        while self.ok < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.ok} requests succeeded; failures: {self.failures[:3]}")
            time.sleep(0.05)

    def servers(self, since: float = 0.0) -> set[str]:
        """The gateway replicas that answered requests started since `since`."""
        with self._lock:
            return {s.server for s in self.samples if s.started >= since and s.server}

    def latencies(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        with self._lock:
            return [s.latency_s for s in self.samples if since <= s.started < until]

    def __enter__(self) -> LoadGenerator:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)


def _retry_after(r: httpx.Response) -> float:
    """A 429/503's Retry-After (capped at 5 s), which a well-behaved client waits before retrying."""
    try:
        return min(float(r.headers.get("retry-after", "0")), 5.0) if r.status_code in (429, 503) else 0.0
    except ValueError:
        return 0.0
