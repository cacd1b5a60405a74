"""Replica choice: which of a model's endpoints a call tries first, second, ...

A `ReplicaPicker` orders endpoints best first; the caller (`open_infer`) tries them in that order.
The route table owns channels and snapshots and only asks its picker for an order, so a new
policy (prefix affinity, health-aware choice) is a new picker, not a change to the table.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    """What a picker reads off an endpoint (`services.common.routes.Endpoint` is one)."""

    address: str
    outstanding: int  # this subscriber's own calls in flight on it


E = TypeVar("E", bound=Candidate)


class ReplicaPicker(Protocol):
    def order(self, endpoints: Sequence[E], bad: Collection[str]) -> list[E]:
        """`endpoints` best first; `bad` holds addresses that failed to connect since the last snapshot."""
        ...


class LeastOutstanding:
    """Least outstanding requests first, ties broken at random (so equal replicas share the load);
    endpoints marked bad are skipped, unless all are (then they are all tried again)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def order(self, endpoints: Sequence[E], bad: Collection[str]) -> list[E]:
        usable = [e for e in endpoints if e.address not in bad] or list(endpoints)
        self._rng.shuffle(usable)
        return sorted(usable, key=lambda e: e.outstanding)  # stable: the shuffle orders the ties
