"""An engine's own Prometheus series, re-exported from the worker replica with the served model's
name added: llama-server serves `llamacpp:*` on its own /metrics, which no Prometheus scrapes (its
port is private to the replica). Sampled every SAMPLE_S into gauges of the same names (their values
as the engine reports them; counters stay monotonic), labelled `model`, per replica process."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import Gauge
from prometheus_client.parser import text_string_to_metric_families

from services.worker.engine import Engine

log = logging.getLogger(__name__)
SAMPLE_S = 5.0
_GAUGES: dict[str, Gauge] = {}


def republish(text: str, model: str) -> int:
    """Set one gauge per sample of `text` (the engine's exposition); the number of samples set."""
    n = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels:  # llama-server's are unlabelled; anything else would need its labels kept
                continue
            gauge = _GAUGES.get(sample.name)
            if gauge is None:
                gauge = _GAUGES[sample.name] = Gauge(sample.name, family.documentation or sample.name, ["model"],
                                                     multiprocess_mode="liveall")
            gauge.labels(model).set(sample.value)
            n += 1
    return n


async def sample_forever(engine: Engine, model: str) -> None:
    """Re-export the engine's series every SAMPLE_S until cancelled (nothing to do for most engines)."""
    while True:
        with contextlib.suppress(Exception):  # an engine restarting, a slow scrape: the next sample will do
            text = await engine.metrics_text()
            if text is None:
                return
            republish(text, model)
        await asyncio.sleep(SAMPLE_S)
