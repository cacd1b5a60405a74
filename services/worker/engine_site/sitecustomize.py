"""Run by Python at the start of every process an engine spawns (its folder is on their PYTHONPATH):
ask for the AMX tile state before vLLM's kernels use it (services/worker/amx.py says why), and
bound vLLM's busy-wait between steps where MSHIP_ENGINE_SPIN_S says so.
Self-contained: the spawned process may not have the project on its path."""

import ctypes
import os
import platform
import sys

if sys.platform == "linux" and platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)  # arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)
    except (OSError, AttributeError):
        pass

_SHM_QUEUE = "vllm.distributed.device_communicators.shm_broadcast"


class _SpinLimit:
    """A meta-path finder that, when vLLM imports its shared-memory queue, bounds how its readers
    (EngineCore waiting for its model worker, the worker for EngineCore) wait between steps.

    vLLM's readers spin with sched_yield for a second after each read, then sleep on a socket the
    writer notifies. On a CPU node that second of spinning takes the cores the model and the token
    path need (docs/operations.md). Here they spin for `seconds`, then sleep on the socket for the
    rest of that second, at most NAP_MS at a time: its notifications can be lost, and vLLM looks
    again only after 5 s, which would be a stall between two tokens. After the second they wait as
    vLLM does. Processes that never import vLLM pay nothing."""

    NAP_MS = 1  # the socket's shortest timeout

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def find_spec(self, name, path, target=None):
        if name != _SHM_QUEUE:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                self.patch(module.SpinCondition)

            spec.loader.exec_module = exec_module
        return spec

    def patch(self, spin_condition) -> None:
        init, wait = spin_condition.__init__, spin_condition.wait
        names = init.__code__.co_varnames[:init.__code__.co_argcount]
        defaults = list(init.__defaults__ or ())
        if names[-1] != "busy_loop_s" or not defaults or not hasattr(spin_condition, "record_read"):
            return  # a vLLM that changed: leave it alone
        # vLLM's own spin is the time after a read in which it expects another: nap within it
        nap_ms, active_s = self.NAP_MS, defaults[-1]
        defaults[-1] = self.seconds
        init.__defaults__ = tuple(defaults)
        import time

        def bounded_wait(condition, timeout_ms=None):
            if condition.is_reader and time.monotonic() - condition.last_read <= active_s:
                timeout_ms = nap_ms if timeout_ms is None else min(timeout_ms, nap_ms)
            return wait(condition, timeout_ms)

        spin_condition.wait = bounded_wait


def _spin_seconds():
    try:
        seconds = float(os.environ.get("MSHIP_ENGINE_SPIN_S", ""))  # services.common.vocabulary.ENV_ENGINE_SPIN_S
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


if (_seconds := _spin_seconds()) is not None:
    sys.meta_path.insert(0, _SpinLimit(_seconds))
