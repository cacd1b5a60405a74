"""`MSHIP_STREAM_DRAIN_S`: how long a replica Serve stops while it serves lets its streams run on.
`mship start` checks it and hands it to every replica; each replica's Serve timeout covers it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.common.vocabulary import (
    DEFAULT_STREAM_DRAIN_S,
    ENV_STREAM_DRAIN_S,
    PLATFORM_ENV,
    stream_drain_s,
)
from tests.platform_process import ROOT


@pytest.mark.parametrize("value, seconds", [(None, DEFAULT_STREAM_DRAIN_S), ("", DEFAULT_STREAM_DRAIN_S),
                                            ("1800", 1800.0), (" 12.5 ", 12.5), ("0", 0.0)])
def test_the_drain_is_300_s_unless_the_environment_sets_it(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(ENV_STREAM_DRAIN_S, raising=False)
    else:
        monkeypatch.setenv(ENV_STREAM_DRAIN_S, value)
    assert stream_drain_s() == seconds


@pytest.mark.parametrize("value", ["ten", "-1", "inf", "nan", "1e400"])
def test_a_drain_that_is_no_duration_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(ENV_STREAM_DRAIN_S, value)
    with pytest.raises(ValueError, match=f"{ENV_STREAM_DRAIN_S}=.*give seconds"):
        stream_drain_s()


def test_mship_start_hands_the_drain_to_every_replica():
    assert ENV_STREAM_DRAIN_S in PLATFORM_ENV


PROBE = """
import json
from services.gateway import deployment as gateway
from services.worker import deployment as worker
print(json.dumps({
    "gateway": [gateway.STREAM_DRAIN_S, gateway.GatewayDeployment._deployment_config.graceful_shutdown_timeout_s],
    "worker": [worker.STREAM_DRAIN_S, worker.WorkerDeployment._deployment_config.graceful_shutdown_timeout_s],
}))
"""


@pytest.mark.parametrize("drain", [1800.0, 0.0])
def test_each_replica_drains_as_the_environment_says_and_serve_waits_for_it(drain):
    """In a fresh process, as a replica imports its deployment with the job's environment."""
    env = {**os.environ, ENV_STREAM_DRAIN_S: f"{drain:g}"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    from services.worker.deployment import RETIRED_DRAIN_S

    assert seen["gateway"][0] == seen["worker"][0] == drain
    assert seen["gateway"][1] > drain  # the listeners' drain and the channels' close come on top
    assert seen["worker"][1] > max(drain, RETIRED_DRAIN_S)  # a retired version's 20 s too, when the drain is 0
