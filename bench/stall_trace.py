"""Who had the CPU while a stream stalled: a sampler for bench/soak.py's `--trace-stalls`.

A thread reads, every `interval_s`, the CPU time of every process under the platform (and of
this bench process) from /proc/<pid>/stat, and the run-queue wait of every thread of the
token-path processes (the gateway and model replicas, vLLM's EngineCore and its workers) from
/proc/<pid>/task/<tid>/schedstat. For a stall (a window of wall time), `explain` names the
processes that ran in it, with their nice value, and the token-path threads that waited for a CPU.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass

import psutil

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
TOKEN_PATH = ("ServeReplica:mship-gateway", "ServeReplica:mship-model-", "EngineCore", "VllmWorker")


@dataclass
class Sample:
    t: float
    cpu_s: dict[int, float]  # pid -> user + system seconds
    wait_s: dict[tuple[int, int], float]  # (pid, tid) of a token-path thread -> run-queue wait seconds


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _waits(pid: int) -> dict[tuple[int, int], float]:
    out = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[(pid, int(tid))] = int(f.read().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                continue
    except OSError:
        pass
    return out


class StallTracer:
    def __init__(self, root_pid: int, interval_s: float = 0.02) -> None:
        self.root, self.interval_s = root_pid, interval_s
        self.samples: list[Sample] = []
        self.names: dict[int, str] = {}
        self.nice: dict[int, int] = {}
        self.threads: dict[tuple[int, int], str] = {}
        self._pids: list[int] = []
        self._token_pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="stall-tracer")

    def start(self) -> StallTracer:
        self._refresh()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _refresh(self) -> None:
        """The process list (every second: replicas and engines come and go)."""
        procs = [psutil.Process(os.getpid())]
        try:
            procs += psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            pass
        self._pids, self._token_pids = [], []
        for p in procs:
            try:
                name = " ".join(p.cmdline())[:80] or p.name()
                self.names[p.pid], self.nice[p.pid] = name, p.nice()
            except psutil.Error:
                continue
            self._pids.append(p.pid)
            if any(tag in name or tag in p.name() for tag in TOKEN_PATH):
                self._token_pids.append(p.pid)
                for t in p.threads():
                    try:
                        with open(f"/proc/{p.pid}/task/{t.id}/comm") as f:
                            self.threads[(p.pid, t.id)] = f.read().strip()
                    except OSError:
                        continue

    def _run(self) -> None:
        last_refresh = time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - last_refresh > 1.0:
                self._refresh()
                last_refresh = now
            cpu = {pid: s for pid in self._pids if (s := _cpu_s(pid)) is not None}
            waits = {k: v for pid in self._token_pids for k, v in _waits(pid).items()}
            self.samples.append(Sample(time.monotonic(), cpu, waits))

    def explain(self, start: float, end: float, top: int = 5) -> str:
        """The processes that used the CPU in [start, end] (monotonic), and the token-path threads
        that waited for one."""
        times = [s.t for s in self.samples]
        i, j = max(0, bisect_left(times, start) - 1), min(len(times) - 1, bisect_left(times, end))
        if j <= i:
            return "no samples"
        a, b = self.samples[i], self.samples[j]
        used = sorted(((b.cpu_s[p] - a.cpu_s.get(p, b.cpu_s[p]), p) for p in b.cpu_s), reverse=True)[:top]
        waited = sorted(((b.wait_s[k] - a.wait_s.get(k, b.wait_s[k]), k) for k in b.wait_s), reverse=True)[:top]
        span = b.t - a.t
        ran = ", ".join(f"{self.names.get(p, p)} (nice {self.nice.get(p, '?')}) {1000 * s:.0f} ms"
                        for s, p in used if s > 0)
        queued = ", ".join(f"{self.names.get(k[0], k[0])[:40]}/{self.threads.get(k, k[1])} {1000 * s:.0f} ms"
                           for s, k in waited if s > 0.001)
        return f"{1000 * span:.0f} ms window; CPU: {ran or 'none'}; run-queue waits: {queued or 'none'}"
