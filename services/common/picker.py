"""Replica choice: which of a model's endpoints a call tries first, second, ...

A `ReplicaPicker` orders endpoints best first; the caller (`open_infer`) tries them in that order.
The route table owns channels and snapshots and only asks its picker for an order, so a new
policy (prefix affinity, health-aware choice) is a new picker, not a change to the table.

A call may carry an *affinity key* (`prefix_affinity_key`: the caller's identity and the leading
system prompt, or the root of a `previous_response_id` chain): calls with the same key share a
prompt prefix, so sending them to one replica lets its prefix cache serve the shared part.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    """What a picker reads off an endpoint (`services.common.routes.Endpoint` is one)."""

    address: str
    outstanding: int  # this subscriber's own calls in flight on it


E = TypeVar("E", bound=Candidate)

LEAST_OUTSTANDING = "least_outstanding"
PREFIX_AFFINITY = "prefix_affinity"
PICKERS = (PREFIX_AFFINITY, LEAST_OUTSTANDING)


class ReplicaPicker(Protocol):
    def order(self, endpoints: Sequence[E], bad: Collection[str], affinity: str | None = None) -> list[E]:
        """`endpoints` best first; `bad` holds addresses that failed to connect since the last snapshot;
        `affinity` is the call's prefix key (None: the call shares no known prefix)."""
        ...


class LeastOutstanding:
    """Least outstanding requests first, ties broken at random (so equal replicas share the load);
    endpoints marked bad are skipped, unless all are (then they are all tried again)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def order(self, endpoints: Sequence[E], bad: Collection[str], affinity: str | None = None) -> list[E]:
        usable = [e for e in endpoints if e.address not in bad] or list(endpoints)
        self._rng.shuffle(usable)
        return sorted(usable, key=lambda e: e.outstanding)  # stable: the shuffle orders the ties


class PrefixAffinity:
    """Power of two choices on the prefix key, with bounded loads.

    The key ranks the endpoints by rendezvous hashing (the same key ranks the same replicas first on
    every gateway, and a replica that leaves moves only its own keys). The key's first choice leads
    while taking the call keeps it within `balance` times the mean load (consistent hashing with
    bounded loads, Mirrokni et al. 2018: the bound grows with the load, so a hot key spills onto its
    second choice as soon as one replica holds more than its share, never only at a fixed excess);
    else its second choice, on the same bound; else the order is plain least outstanding. Everything
    after the lead is least outstanding, so retries before the first token go where the load is lowest.
    """

    def __init__(self, balance: float = 1.25, rng: random.Random | None = None) -> None:
        if balance < 1.0:
            raise ValueError("balance must be at least 1 (1: every replica at most its mean share)")
        self.balance = balance
        self._fallback = LeastOutstanding(rng)

    def order(self, endpoints: Sequence[E], bad: Collection[str], affinity: str | None = None) -> list[E]:
        ordered = self._fallback.order(endpoints, bad)
        if affinity is None or len(ordered) < 2:
            return ordered
        # the most calls an endpoint may hold once it takes this one
        cap = math.ceil(self.balance * (sum(e.outstanding for e in ordered) + 1) / len(ordered))
        first, second = sorted(ordered, key=lambda e: _rank(affinity, e.address), reverse=True)[:2]
        lead = first if first.outstanding < cap else second if second.outstanding < cap else None
        if lead is None or lead is ordered[0]:
            return ordered
        return [lead, *(e for e in ordered if e is not lead)]


def _rank(key: str, address: str) -> int:
    """Rendezvous weight of `address` for `key` (stable across processes: no salted hash())."""
    digest = hashlib.blake2b(f"{key}\0{address}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def make_picker(name: str) -> ReplicaPicker:
    """The picker named by `MSHIP_REPLICA_PICKER` (one of `PICKERS`)."""
    if name == PREFIX_AFFINITY:
        return PrefixAffinity()
    if name == LEAST_OUTSTANDING:
        return LeastOutstanding()
    raise ValueError(f"unknown replica picker {name!r}; known: {', '.join(PICKERS)}")
