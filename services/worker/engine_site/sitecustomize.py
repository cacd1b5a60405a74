"""Run by Python at the start of every process an engine spawns (its folder is on their PYTHONPATH):
ask for the AMX tile state before vLLM's kernels use it (services/worker/amx.py says why).
Self-contained: the spawned process may not have the project on its path."""

import ctypes
import platform
import sys

if sys.platform == "linux" and platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)  # arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)
    except (OSError, AttributeError):
        pass
