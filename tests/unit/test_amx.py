"""Engine processes ask for the AMX tile state before vLLM's AMX kernels run (services/worker/amx.py):
a process started with the engine's PYTHONPATH holds the permission, one without it does not."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from services.worker import vllm_engine

# arch_prctl(ARCH_GET_XCOMP_SUPP / ARCH_GET_XCOMP_PERM): is the AMX tile data bit (18) set?
PROBE = ("import ctypes; v = ctypes.c_uint64(); "
         "ctypes.CDLL(None).syscall(158, {op}, ctypes.byref(v)); print(bool(v.value >> 18 & 1))")


def bit(op: int, env: dict[str, str]) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE.format(op=op)], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip() == "True"


needs_amx = pytest.mark.skipif(platform.machine() != "x86_64" or sys.platform != "linux"
                               or not bit(0x1021, dict(os.environ)), reason="no AMX on this CPU")


@needs_amx
def test_processes_an_engine_starts_hold_the_amx_permission(monkeypatch: pytest.MonkeyPatch):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert not bit(0x1022, env)  # a plain process never asked
    monkeypatch.setattr(os, "environ", env)  # what set_engine_env sets stays in this test
    vllm_engine.set_engine_env()
    assert "engine_site" in env["PYTHONPATH"]
    assert bit(0x1022, env)  # a process started as vLLM starts its own: asked at start
    vllm_engine.set_engine_env()  # idempotent: the folder is on the path once
    assert env["PYTHONPATH"].count("engine_site") == 1
