"""Every `mship_*` series the code defines is documented in docs/metrics.md, and every documented
one exists (the dashboard and the alert rules are checked against the same table)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

import services.coordinator.metrics
import services.gateway.edge.metrics
import services.state.metrics
import services.worker.metrics  # noqa: F401  (they register their series on import)

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> set[str]:
    return set(re.findall(r"^\| `(mship_[a-z_]+)` \|", DOC.read_text(), re.MULTILINE))


def defined() -> set[str]:
    out = set()
    for metric in REGISTRY.collect():
        if metric.name.startswith("mship_"):
            out.add(metric.name + ("_total" if metric.type == "counter" else ""))
    return out


def test_every_series_is_documented_and_every_documented_one_exists():
    assert defined() == documented()
