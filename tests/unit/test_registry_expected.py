"""Readiness never runs ahead of what was asked for: models expected at a start (its start set, the
committed set) are pending in every routing snapshot until routed, or until a reconcile leaves them
out; a routed model with no live replica is pending too."""

from __future__ import annotations

from mship.common.v1 import common_pb2
from services.coordinator.registry import ActiveModel, ReplicaRegistry


async def test_an_expected_model_is_pending_until_it_is_routed_and_served():
    registry = ReplicaRegistry()
    assert list(registry.snapshot().pending) == []
    version = registry.version
    await registry.expect(["chat", "embed"])
    assert registry.version > version  # the watchers hear of it
    assert list(registry.snapshot().pending) == ["chat", "embed"]
    await registry.set_active("chat", ActiveModel("v1", common_pb2.USECASE_GENERATE))
    assert list(registry.snapshot().pending) == ["chat", "embed"]  # routed, no live replica yet: still pending
    assert registry.expected == {"embed"}


async def test_a_reconcile_that_leaves_an_expected_model_out_ends_the_wait():
    registry = ReplicaRegistry()
    await registry.expect(["old", "new"])
    await registry.settle_expected(["new"])
    assert list(registry.snapshot().pending) == ["new"]
    await registry.expect(["new"])  # expecting again what is expected changes nothing
    await registry.set_active("new", ActiveModel("v1", common_pb2.USECASE_GENERATE))
    await registry.expect(["new"])  # nor what is already routed
    assert registry.expected == set()
