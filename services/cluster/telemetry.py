"""A node's telemetry, owned by the process that runs the node (`mship start`, `mship join`).

Metrics: every process of the node (replicas, vLLM's stat loggers included) writes its
prometheus_client values into one per-node directory (prometheus_client's multiprocess mode,
`PROMETHEUS_MULTIPROC_DIR` in the Ray node's environment, which its worker processes inherit), and
this process serves them all on the node's one `--metrics-port`. The node advertises that port as a
Ray node label, so the head can list every node's port in a Prometheus `file_sd` file.

Logs and traces: `--log-target` and `--otel-endpoint` become the node's environment too, so each
node may log and trace to its own collector (services/common/logs.py and tracing.py read them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from services.common.vocabulary import ENV_LOG_TARGET, ENV_METRICS_DIR, ENV_NO_METRICS, ENV_OTEL_ENDPOINT

log = logging.getLogger(__name__)
DEFAULT_METRICS_PORT = 8079
METRICS_PORT_LABEL = "mship-metrics-port"
SD_INTERVAL_S = 10.0
_PID = re.compile(r"_(\d+)\.db$")
LOCK_FILE = ".mship-node.lock"


@dataclass
class NodeTelemetry:
    metrics: bool = True
    metrics_host: str = "127.0.0.1"  # what the metrics port binds (the node's services' --host)
    metrics_port: int = DEFAULT_METRICS_PORT
    log_target: str | None = None
    otel_endpoint: str | None = None
    agent_port: int | None = None  # Ray's agent: its /api/healthz is the node's health probe (None: a free port)
    metrics_dir: Path | None = None  # made by start()
    _server: MetricsServer | None = field(default=None, repr=False)
    _made_dir: bool = field(default=False, repr=False)
    _lock: int | None = field(default=None, repr=False)

    def start(self) -> None:
        """Make the node's metrics directory (fresh) and serve it; before the Ray node starts. A
        node started by someone else (KubeRay) names its directory in its environment instead: this
        node then takes it (MetricsDirInUse when another live node has it: each would serve the
        other's series as its own) and empties it of a previous run's files (their pids may be
        this run's, and their live gauges would never leave)."""
        if not self.metrics:
            return
        given = os.environ.get(ENV_METRICS_DIR)
        self.metrics_dir = Path(given) if given else Path(tempfile.mkdtemp(prefix="mship-metrics-"))
        self._made_dir = not given
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _take(self.metrics_dir)
        if given:
            for stale in self.metrics_dir.glob("*.db"):
                stale.unlink(missing_ok=True)
        self._server = MetricsServer(self.metrics_dir, self.metrics_host, self.metrics_port)

    def env(self) -> dict[str, str]:
        """What every process of the node inherits."""
        out = {} if self.metrics else {ENV_NO_METRICS: "1"}
        if self.metrics_dir is not None:
            out[ENV_METRICS_DIR] = str(self.metrics_dir)
        if self.log_target:
            out[ENV_LOG_TARGET] = self.log_target
        if self.otel_endpoint:
            out[ENV_OTEL_ENDPOINT] = self.otel_endpoint
        return out

    def labels(self) -> dict[str, str]:
        return {METRICS_PORT_LABEL: str(self.metrics_port)} if self.metrics else {}

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self.metrics_dir is not None and self._made_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)  # the lock goes with it
            self._lock = None


class MetricsDirInUse(RuntimeError):
    """Another live node serves this metrics directory."""


def _take(directory: Path) -> int:
    """An exclusive lock on the node's metrics directory, held while the node runs (its fd)."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise MetricsDirInUse(f"{ENV_METRICS_DIR}={directory} is another live node's metrics directory: "
                              "give each node its own") from None
    return fd


class MetricsServer:
    """The node's metrics port: the multiprocess directory, aggregated at each scrape."""

    def __init__(self, directory: Path, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry()
        registry.register(LiveMultiProcessCollector(directory))
        self.httpd, self.thread = start_http_server(port, addr=host, registry=registry)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class LiveMultiProcessCollector:
    """prometheus_client's MultiProcessCollector, after marking the node's dead processes dead:
    their `live*` gauges leave (a stopped replica's in-flight count must not linger); counters and
    histograms keep what they counted."""

    def __init__(self, directory: Path) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self.directory = directory
        self._inner = MultiProcessCollector(None, path=str(directory))
        self._lock = threading.Lock()  # scrapes may come at once (one thread each)

    def collect(self):
        from prometheus_client import multiprocess

        with self._lock:
            # A live file of a dead pid is removed, so it is looked at once; no memory of dead pids:
            # a pid comes back (a later process's) and its files must leave with it in turn.
            for pid in {int(m.group(1)) for p in self.directory.glob("gauge_live*.db") if (m := _PID.search(p.name))}:
                if not _alive(pid):
                    multiprocess.mark_process_dead(pid, str(self.directory))
            return self._inner.collect()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ServiceDiscoveryFile:
    """The head's Prometheus `file_sd` file: every alive node's metrics address (its IP and the port
    its label advertises), rewritten atomically every SD_INTERVAL_S while the platform runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mship-sd", daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def write(self) -> None:
        import ray

        targets = sorted(f"{n['NodeManagerAddress']}:{n['Labels'][METRICS_PORT_LABEL]}" for n in ray.nodes()
                         if n.get("Alive") and METRICS_PORT_LABEL in (n.get("Labels") or {}))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": targets, "labels": {"job": "mship"}}], indent=2) + "\n")
        tmp.replace(self.path)

    def _run(self) -> None:
        while not self._stop.wait(SD_INTERVAL_S):
            try:
                self.write()
            except Exception as e:  # Ray going away while the platform stops
                log.debug("service discovery file not updated: %r", e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._thread.join(2)
