"""SIGHUP must not stop a platform process: operators and tools send it after editing a config file
(the API keys, the rate limits), which the gateways re-read on change anyway.

Python's `signal.signal` works only in a process's main thread, and a Serve replica's constructor
runs in another one; the default action (terminate) would kill the replica. libc's `signal()` sets
the process-wide disposition from any thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal

SIG_IGN = 1


def ignore_sighup() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(int(signal.SIGHUP), ctypes.c_void_p(SIG_IGN))
