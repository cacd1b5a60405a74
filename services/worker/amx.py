"""AMX on Linux: a process must ask the kernel for the AMX tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)`, Linux >= 5.16) before its first tile instruction, else that instruction is
SIGILL. vLLM's CPU kernels pick AMX whenever the CPU has it (bf16 attention and GEMMs) but only
oneDNN asks for the permission, so an engine process whose first AMX use is vLLM's own kernel dies
on its first step (seen here: `Worker proc VllmWorker-0 died unexpectedly (exit code: -4)` on a
3-token warm-up). Every engine process therefore asks at start: this process through
`request_amx()`, and the processes vLLM spawns through `engine_site/sitecustomize.py`, which Python
runs at their start (`set_engine_env` puts its folder on their PYTHONPATH).

Pure ctypes: cheap, no torch import; a no-op where there is no AMX or no such call.
"""

from __future__ import annotations

import ctypes
import platform
import sys

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request_amx() -> bool:
    """Ask for the AMX tile state; True when granted (False: not x86_64 Linux, or refused)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM,
                                                         _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False
