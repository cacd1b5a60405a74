"""Model versions: a fingerprint of the fields whose change needs a reload.

Scale (num_replicas, autoscaling) and admission (rate_limits, backpressure) are left out on purpose:
changing them rescales or re-limits the live deployment in place instead of starting a new version.
"""

from __future__ import annotations

import hashlib
import re

from mship.common.v1 import common_pb2

LIMIT_FIELDS = ("rate_limits", "max_ongoing_requests", "max_queued_requests")
SCALE_FIELDS = ("num_replicas", "autoscaling", *LIMIT_FIELDS)
APP_PREFIX = "mship-model-"


def version_of(spec: common_pb2.ModelSpec) -> str:
    reload_relevant = common_pb2.ModelSpec()
    reload_relevant.CopyFrom(spec)
    for name in SCALE_FIELDS:
        reload_relevant.ClearField(name)
    data = reload_relevant.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest()[:12]


def limits_of(spec: common_pb2.ModelSpec) -> bytes:
    """The admission part of a spec, comparable (did only the limits change?)."""
    limits = common_pb2.ModelSpec()
    limits.CopyFrom(spec)
    for f in spec.DESCRIPTOR.fields:
        if f.name not in LIMIT_FIELDS:
            limits.ClearField(f.name)
    return limits.SerializeToString(deterministic=True)


def app_name(spec: common_pb2.ModelSpec, version: str | None = None) -> str:
    """The Serve application of one model version: readable name + version."""
    safe = re.sub(r"[^A-Za-z0-9-]", "-", spec.name).strip("-").lower()[:40] or "model"
    return f"{APP_PREFIX}{safe}-{version or version_of(spec)}"
