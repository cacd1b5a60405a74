"""A node's one metrics port (services/cluster/telemetry.py): the values every process of the node
wrote into its multiprocess directory, summed; a dead process's live gauges leave, its counters
stay; the head's file_sd file lists every alive node's advertised port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from services.cluster import telemetry
from services.cluster.telemetry import METRICS_PORT_LABEL, NodeTelemetry, ServiceDiscoveryFile
from tests.platform_process import free_port

WRITER = textwrap.dedent("""
    import sys
    from prometheus_client import Counter, Gauge
    Counter("mship_test_calls", "calls", ["model"]).labels("m").inc(int(sys.argv[1]))
    Gauge("mship_test_inflight", "in flight", ["model"], multiprocess_mode="livesum").labels("m").set(3)
    sys.stdout.write("written\\n"); sys.stdout.flush()
    sys.stdin.read()  # alive until the test closes our stdin
""")


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def test_the_node_port_sums_its_processes_and_forgets_the_live_gauges_of_dead_ones():
    node = NodeTelemetry(metrics=True, metrics_port=free_port())
    node.start()
    try:
        assert node.env()["PROMETHEUS_MULTIPROC_DIR"] == str(node.metrics_dir)
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(n)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env={**os.environ, **node.env()})
                   for n in (2, 5)]
        for w in writers:
            assert w.stdout.readline() == "written\n"
        text = scrape(node.metrics_port)
        assert 'mship_test_calls_total{model="m"} 7.0' in text
        assert 'mship_test_inflight{model="m"} 6.0' in text
        writers[0].communicate("")  # one process ends
        text = scrape(node.metrics_port)
        assert 'mship_test_calls_total{model="m"} 7.0' in text  # what it counted stays
        assert 'mship_test_inflight{model="m"} 3.0' in text  # its live gauge left
        writers[1].communicate("")
    finally:
        node.stop()
    assert not node.metrics_dir.exists()


def test_the_discovery_file_lists_alive_nodes_with_their_advertised_ports(tmp_path, monkeypatch):
    nodes = [{"Alive": True, "NodeManagerAddress": "10.0.0.1", "Labels": {METRICS_PORT_LABEL: "8079"}},
             {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Labels": {METRICS_PORT_LABEL: "9100"}},
             {"Alive": False, "NodeManagerAddress": "10.0.0.3", "Labels": {METRICS_PORT_LABEL: "8079"}},
             {"Alive": True, "NodeManagerAddress": "10.0.0.4", "Labels": {}}]  # --no-metrics
    import ray
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    sd = ServiceDiscoveryFile(tmp_path / "run" / "sd.json")
    sd.write()
    assert json.loads(sd.path.read_text()) == [{"targets": ["10.0.0.1:8079", "10.0.0.2:9100"],
                                                "labels": {"job": "mship"}}]


def test_no_metrics_means_no_directory_no_port_and_no_label():
    node = NodeTelemetry(metrics=False, log_target="syslog://127.0.0.1:514")
    node.start()
    assert (node.metrics_dir, node.labels()) == (None, {})
    assert node.env() == {"MSHIP_LOG_TARGET": "syslog://127.0.0.1:514", "MSHIP_NO_METRICS": "1"}
    node.stop()
    assert telemetry.DEFAULT_METRICS_PORT == 8079


def test_an_engines_own_series_are_re_exported_under_their_names_with_the_model():
    from prometheus_client import REGISTRY, generate_latest

    from services.worker.engine_metrics import republish

    text = ("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n")
    assert republish(text, "smol") == 2
    assert republish(text.replace(" 12", " 30"), "smol") == 2
    out = generate_latest(REGISTRY).decode()
    assert 'llamacpp:prompt_tokens_total{model="smol"} 30.0' in out
    assert 'llamacpp:requests_processing{model="smol"} 1.0' in out


def live_values(collector: telemetry.LiveMultiProcessCollector, name: str) -> list[float]:
    return [s.value for m in collector.collect() for s in m.samples if s.name == name]


def test_a_reused_pid_of_a_dead_process_has_its_live_gauges_forgotten_too(tmp_path):
    """Pids come back (a container's are small): a second process that had the pid of one already
    found dead, and died too, must not leave its in-flight count behind for ever."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    assert writer.stdout.readline() == "written\n"
    live_file = tmp_path / f"gauge_livesum_{writer.pid}.db"
    written = live_file.read_bytes()
    writer.communicate("")
    collector = telemetry.LiveMultiProcessCollector(tmp_path)
    assert live_values(collector, "mship_test_inflight") == []  # dead: its live gauge left
    live_file.write_bytes(written)  # the same pid again: a later process wrote its gauge, then died
    assert live_values(collector, "mship_test_inflight") == []


def test_a_given_metrics_directory_starts_without_a_previous_runs_files(tmp_path, monkeypatch):
    """KubeRay names the directory (an emptyDir kept across a container's restarts): the files of the
    node's previous run (whose pids the new processes may well have) are not summed into this one's."""
    stale = tmp_path / "gauge_livesum_7.db"
    stale.write_bytes(b"")
    (tmp_path / "counter_7.db").write_bytes(b"")
    (tmp_path / "keep.txt").write_text("not ours")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    node = NodeTelemetry(metrics=True, metrics_port=free_port())
    node.start()
    try:
        assert node.metrics_dir == tmp_path
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["keep.txt"]
    finally:
        node.stop()
    assert tmp_path.exists()  # given, not ours to remove


def test_two_nodes_never_share_a_metrics_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    first = NodeTelemetry(metrics=True, metrics_port=free_port())
    first.start()
    try:
        second = NodeTelemetry(metrics=True, metrics_port=free_port())
        with pytest.raises(telemetry.MetricsDirInUse):
            second.start()
    finally:
        first.stop()
    again = NodeTelemetry(metrics=True, metrics_port=free_port())
    again.start()  # the first one stopped: free again
    again.stop()


COORDINATOR = textwrap.dedent("""
    from services.coordinator import metrics
    metrics.ROUTING_VERSION.set(5)
    metrics.REPLICAS.labels("gone", "unhealthy").set(1)
""")


def test_a_dead_coordinators_replica_gauges_leave_with_it(tmp_path):
    """A coordinator restarts (services/coordinator/recovery.py): what the dead one last said of a
    model the new one never routes (an unhealthy replica) must not page for ever."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", COORDINATOR], env=env, check=True, timeout=60,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    collector = telemetry.LiveMultiProcessCollector(tmp_path)
    assert live_values(collector, "mship_coordinator_replicas") == []
    assert live_values(collector, "mship_coordinator_routing_version") == []
