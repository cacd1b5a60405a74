"""A circuit breaker per worker endpoint, for whoever routes calls (the gateway, the Python client).

closed: in rotation; every failure counts, a success resets the count. The calls that were in flight
  when a failure was counted fail with it (one broken connection fails every call on it): their
  failures are that one, not more.
open: after `threshold` consecutive failures (unreachable, or a stream that broke), out of rotation
  for `cooldown_s` (pickers skip it; if every endpoint of a model is out, all are tried anyway).
half-open: after the cool-down, a probe (the worker's gRPC health check, never a client's request)
  decides: SERVING closes the circuit, anything else opens it for another cool-down.

Defaults from MSHIP_BREAKER_FAILURES (3) and MSHIP_BREAKER_COOLDOWN_S (5). State is kept across
routing snapshots for endpoints that stay, and dropped for those that leave.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.common.vocabulary import ENV_BREAKER_COOLDOWN_S, ENV_BREAKER_FAILURES

DEFAULT_THRESHOLD, DEFAULT_COOLDOWN_S = 3, 5.0


@dataclass
class _Circuit:
    failures: int = 0
    failed_at: float = float("-inf")  # when the latest failure was counted
    open_until: float | None = None  # set while open (and while its probe runs)
    probing: bool = False


class EndpointBreaker:
    def __init__(self, threshold: int | None = None, cooldown_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold or int(os.environ.get(ENV_BREAKER_FAILURES) or DEFAULT_THRESHOLD)
        self.cooldown_s = cooldown_s if cooldown_s is not None else float(
            os.environ.get(ENV_BREAKER_COOLDOWN_S) or DEFAULT_COOLDOWN_S)
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}

    def failure(self, address: str, started_at: float | None = None) -> None:
        """A call to `address` failed; `started_at` (this breaker's clock): when it began."""
        circuit = self._circuits.setdefault(address, _Circuit())
        if started_at is not None and started_at <= circuit.failed_at:
            return  # it was in flight when the latest failure was counted: the same one
        circuit.failures += 1
        circuit.failed_at = self._clock()
        circuit.probing = False
        if circuit.failures >= self.threshold:
            circuit.open_until = self._clock() + self.cooldown_s

    def success(self, address: str) -> None:
        self._circuits.pop(address, None)

    def is_open(self, address: str) -> bool:
        circuit = self._circuits.get(address)
        return circuit is not None and circuit.open_until is not None

    def excluded(self) -> set[str]:
        """Addresses out of rotation now (open, or half-open with its probe under way)."""
        return {a for a, c in self._circuits.items() if c.open_until is not None}

    def due_for_probe(self) -> list[str]:
        """Open circuits whose cool-down has passed; each is marked as probing (one probe at a time)."""
        now, due = self._clock(), []
        for address, circuit in self._circuits.items():
            if circuit.open_until is not None and not circuit.probing and now >= circuit.open_until:
                circuit.probing = True
                due.append(address)
        return due

    def probed(self, address: str, serving: bool) -> None:
        if serving:
            self.success(address)
        elif (circuit := self._circuits.get(address)) is not None:
            circuit.probing = False
            circuit.open_until = self._clock() + self.cooldown_s

    def keep_only(self, addresses: Iterable[str]) -> None:
        live = set(addresses)
        for address in list(self._circuits):
            if address not in live:
                del self._circuits[address]
