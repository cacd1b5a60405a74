"""One Ray node process of this machine: `ray start --block` (through ray_cli), as a head or joined
to one, in its own process group so that stopping it ends exactly what it started.

Failures are classified for operators: a refused token, an unreachable head, anything else with
the tail of Ray's output. SIGTERM makes Ray drain the node (Serve moves its replicas, for up to the
drain timeout) before its processes stop.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import psutil

from services.cluster.ports import free_port
from services.common.vocabulary import ENV_GCS_REDIS_ADDRESS, ENV_GCS_REDIS_PASSWORD

STARTED_MARK = "Ray runtime started"
AUTH_MARKS = ("AuthenticationError", "InvalidAuthToken")
UNREACHABLE_MARKS = ("Timed out while waiting for GCS", "Failed to connect to GCS", "Unable to connect to GCS")
# A head whose GCS lives in Redis (RAY_REDIS_ADDRESS) and cannot use it: Ray exits at once with a
# C++ check failure and a stack trace, this line the only useful one.
REDIS_MARKS = ("WRONGPASS", "NOAUTH", "Failed to connect to Redis")


class NodeStartError(RuntimeError):
    def __init__(self, kind: str, message: str) -> None:  # kind: auth | unreachable | redis | failed
        super().__init__(message)
        self.kind = kind


@dataclass
class NodeConfig:
    head: bool
    gcs_port: int = 6380                  # head: where the GCS listens
    gcs_address: str = ""                 # joiner: the head's GCS
    node_ip: str | None = None            # the address other nodes reach; None: Ray's own choice
    num_cpus: float | None = None
    num_gpus: int | None = None
    memory: int | None = None
    node_name: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    token: str | None = None              # the cluster token (Ray token auth), None: auth off
    drain_timeout_s: float = 30.0         # SIGTERM: how long Serve may move this node's replicas
    labels: dict[str, str] = field(default_factory=dict)  # Ray node labels (e.g. its metrics port)
    extra_env: dict[str, str] = field(default_factory=dict)  # what every process of the node inherits
    no_monitor: bool = False              # head: an external autoscaler (KubeRay's) manages the cluster
    redis_password: str | None = None     # head: the password of the GCS's Redis (RAY_REDIS_ADDRESS)
    agent_port: int | None = None         # Ray's agent (its /api/healthz); None: a free port

    def command(self) -> list[str]:
        host = self.node_ip or "0.0.0.0"
        cmd = [sys.executable, "-m", "services.cluster.ray_cli", "start", "--block", "--disable-usage-stats",
               # Fixed defaults that co-located nodes would share: give each node its own.
               "--dashboard-agent-listen-port", str(self.agent_port or free_port(host)),
               # Ray's log monitor tails every log file of the node to stream it to drivers, at
               # nice 0 beside the engines; the platform's driver takes no logs (log_to_driver=False).
               "--include-log-monitor", "false"]
        if self.head:
            cmd += ["--head", "--port", str(self.gcs_port), "--include-dashboard", "false",
                    "--dashboard-port", str(free_port(host)), "--ray-client-server-port", str(free_port(host))]
            if self.no_monitor:  # Ray's own monitor would report beside the external autoscaler
                cmd.append("--no-monitor")
            if self.redis_password:  # Ray reads no environment variable for it (KubeRay passes it so too)
                cmd += ["--redis-password", self.redis_password]
        else:
            cmd += ["--address", self.gcs_address]
        for flag, value in (("--node-ip-address", self.node_ip), ("--num-cpus", self.num_cpus),
                            ("--num-gpus", self.num_gpus), ("--memory", self.memory),
                            ("--node-name", self.node_name)):
            if value is not None:
                cmd += [flag, str(int(value) if isinstance(value, float) and value.is_integer() else value)]
        if self.resources:
            cmd += ["--resources", json.dumps(self.resources)]
        if self.labels:
            cmd += ["--labels", ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))]
        return cmd

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = {**base, **self.extra_env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(self.drain_timeout_s)}
        env.pop("RAY_AUTH_TOKEN", None)
        # Always explicit: with RAY_AUTH_MODE unset, Ray 2.60 turns token auth on by itself when
        # ~/.ray/auth_token exists (a head the platform's own driver then cannot join).
        env["RAY_AUTH_MODE"] = "token" if self.token else "disabled"
        if self.token:
            env["RAY_AUTH_TOKEN"] = self.token
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # a driver's loopback switch; a joiner refuses it
        return env


def raise_open_files_limit() -> None:
    """Soft open-files limit up to the hard one, for the node's processes (which inherit it): a
    raylet and its workers hold many sockets, and a container runtime may give 1024. KubeRay's own
    `ray start` command does `ulimit -n 65536`; the chart runs ours instead."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def gcs_redis_password(env: Mapping[str, str]) -> str | None:
    """The head's `--redis-password`: KubeRay's REDIS_PASSWORD, when the GCS is in Redis (RAY_REDIS_ADDRESS)."""
    if env.get(ENV_GCS_REDIS_ADDRESS):
        return env.get(ENV_GCS_REDIS_PASSWORD) or None
    return None


class RayNode:
    """A running `ray start --block`; its output is kept (the last lines) and echoed to `echo`."""

    def __init__(self, cfg: NodeConfig, env: dict[str, str] | None = None, echo: bool = False) -> None:
        self.cfg = cfg
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        self._started = threading.Event()
        self._echo = echo
        self.env = cfg.env(dict(env if env is not None else os.environ))
        raise_open_files_limit()
        self.proc = subprocess.Popen(cfg.command(), env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     process_group=0)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            if self._echo:
                print(line, end="", file=sys.stderr, flush=True)
            if STARTED_MARK in line:
                self._started.set()

    def wait_started(self, timeout_s: float) -> None:
        """Until Ray reports the node up; NodeStartError (classified) if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while not self._started.wait(0.2):
            if self.proc.poll() is not None:
                self._reader.join(2)
                raise self._failure()
            if time.monotonic() > deadline:
                self.stop(grace_s=5)
                raise self._failure(timed_out=True)

    def _failure(self, timed_out: bool = False) -> NodeStartError:
        text = "\n".join(self.output)
        where = self.cfg.gcs_address or f"port {self.cfg.gcs_port}"
        if self.cfg.head and (line := next((o for o in self.output if any(m in o for m in REDIS_MARKS)), None)):
            reason = line[line.find("RedisError"):] if "RedisError" in line else line
            return NodeStartError("redis", f"the Ray head cannot use the GCS's Redis at {ENV_GCS_REDIS_ADDRESS}="
                                  f"{self.env.get(ENV_GCS_REDIS_ADDRESS, '?')}: {reason} (is it reachable from "
                                  f"here, and {ENV_GCS_REDIS_PASSWORD} its password?)")
        if any(mark in text for mark in AUTH_MARKS):
            return NodeStartError("auth", f"the cluster at {where} refused this node's token")
        if timed_out or any(mark in text for mark in UNREACHABLE_MARKS):
            return NodeStartError("unreachable", f"cannot reach the Ray head at {where}")
        tail = "\n".join(list(self.output)[-15:])
        return NodeStartError("failed", f"the Ray node exited with {self.proc.returncode}:\n{tail}")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float | None = None, hurry: threading.Event | None = None) -> list[int]:
        """SIGTERM (Ray drains the node first), then SIGKILL of the group once the grace runs out or
        `hurry` is set (a second signal). Returns the pids that had to be SIGKILLed that way: none
        after a clean stop (the group's leftovers are still killed then, as routine cleanup)."""
        grace = self.cfg.drain_timeout_s + 15 if grace_s is None else grace_s
        forced: list[int] = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # to `ray start` only: the group's raylet must drain first
            end = time.monotonic() + grace
            while self.proc.poll() is None and time.monotonic() < end and not (hurry and hurry.is_set()):
                try:
                    self.proc.wait(0.1)  # short: a second signal must not wait out the grace
                except subprocess.TimeoutExpired:
                    pass
            if self.proc.poll() is None:
                forced = self._group()
        self._kill_group()  # anything of the group that outlived it (Ray's agents can)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # SIGKILLed: only the kernel's reaping is left
        self._wait_group_gone(5.0)
        return forced

    def _wait_group_gone(self, timeout_s: float) -> None:
        """A SIGKILL is delivered, not done, when `killpg` returns: the stop is over only once no
        member of the group still runs (their ports and files are free for whoever comes next)."""
        end = time.monotonic() + timeout_s
        while self._group() and time.monotonic() < end:
            time.sleep(0.02)

    def _group(self) -> list[int]:
        """The live processes of the node's process group (its leader is `ray start`)."""
        pids = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(p.pid) == self.proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    pids.append(p.pid)
        return pids

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
