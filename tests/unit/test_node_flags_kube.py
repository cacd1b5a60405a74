"""The node flags a Kubernetes (KubeRay) deployment needs, decided before anything starts: where
gateway replicas may run (`mship_gateway`, `join --no-gateway`), what the head offers Ray
(`--node-num-cpus`, `--node-memory`), `--no-ray-monitor`, and the GCS's Redis password
(RAY_REDIS_ADDRESS + REDIS_PASSWORD -> `ray start --redis-password`)."""

from __future__ import annotations

import os
import sys

import pytest

from clients import node_commands
from clients.cli import main, parser
from clients.modelset import ConfigError
from clients.node_flags import head_node_flags
from services.cluster.capabilities import SLOTS, capabilities_of, node_resources
from services.cluster.ray_node import NodeConfig, NodeStartError, RayNode
from services.common.vocabulary import (
    ENV_GCS_REDIS_ADDRESS,
    ENV_GCS_REDIS_PASSWORD,
    ENV_GCS_STORAGE_NAMESPACE,
    ENV_NODE_CAPABILITIES,
    GATEWAY_RESOURCE,
)
from services.launcher import PlatformConfig, gateway_env, gateway_options, head_node

GCS_REDIS = {ENV_GCS_REDIS_ADDRESS: "redis.ns.svc:6379", ENV_GCS_REDIS_PASSWORD: "s3cret"}


def flag_value(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def start_flags(*argv: str) -> dict:
    return head_node_flags(parser().parse_args(["start", *argv]))


def joined_config(monkeypatch, *argv: str) -> NodeConfig:
    """The NodeConfig `mship join` would start, without starting it."""
    seen: list[NodeConfig] = []
    monkeypatch.setattr(node_commands, "_joined", lambda args, cfg, *rest: seen.append(cfg) or 0)
    monkeypatch.setenv(ENV_NODE_CAPABILITIES, '["vllm"]')
    with pytest.raises(SystemExit) as done:
        main(["join", "--gcs-address", "127.0.0.1:1", "--no-metrics", *argv])
    assert done.value.code == 0
    (cfg,) = seen
    return cfg


def test_the_head_always_advertises_the_gateway_resource():
    with_models = head_node(PlatformConfig(capabilities=["vllm"]), {})
    assert with_models.resources == {"mship_vllm": SLOTS, GATEWAY_RESOURCE: SLOTS}
    control_plane_only = head_node(PlatformConfig(models_on_head=False), {})
    assert control_plane_only.resources == {GATEWAY_RESOURCE: SLOTS}
    assert flag_value(control_plane_only.command(), "--resources") == '{"mship_gateway": 1000.0}'


def test_a_joiner_advertises_the_gateway_resource_unless_no_gateway(monkeypatch):
    assert joined_config(monkeypatch).resources == {"mship_vllm": SLOTS, GATEWAY_RESOURCE: SLOTS}
    no_gateway = joined_config(monkeypatch, "--no-gateway")
    assert no_gateway.resources == {"mship_vllm": SLOTS}
    assert GATEWAY_RESOURCE not in (flag_value(no_gateway.command(), "--resources") or "")


def test_capability_listings_ignore_the_gateway_resource():
    assert capabilities_of(node_resources(["vllm"], gateway=True)) == ["vllm"]
    assert capabilities_of(node_resources([], gateway=True)) == []
    assert capabilities_of({"CPU": 8.0, GATEWAY_RESOURCE: SLOTS, "node:10.0.0.2": 1.0}) == []


def test_gateway_replicas_request_the_gateway_resource_except_attached():
    from services.gateway.deployment import GatewayDeployment

    base = GatewayDeployment.ray_actor_options
    env = {"GRPC_EXPERIMENTS": "event_engine_client"}  # the operator's choice: no environment of its own
    placed = gateway_options(PlatformConfig(gateway_replicas=2), base, env)
    assert placed == {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.1, "resources": {GATEWAY_RESOURCE: 1}}}
    assert GatewayDeployment.options(**placed).ray_actor_options == placed["ray_actor_options"]
    assert base == {"num_cpus": 0.1}  # the deployment's own options are not changed in place
    scaled = gateway_options(PlatformConfig(gateway_min_replicas=1, gateway_max_replicas=3), base, env)
    assert scaled["autoscaling_config"]["max_replicas"] == 3 and "num_replicas" not in scaled
    assert scaled["ray_actor_options"]["resources"] == {GATEWAY_RESOURCE: 1}
    # Someone else's Ray cluster: nothing advertises the resource there, so none is requested.
    attached = gateway_options(PlatformConfig(ray_address="auto"), base, env)
    assert attached["ray_actor_options"] == {"num_cpus": 0.1}


def test_gateway_replicas_read_grpc_messages_on_the_poller_thread_unless_the_operator_decides():
    from services.gateway.deployment import GatewayDeployment

    options = gateway_options(PlatformConfig(), GatewayDeployment.ray_actor_options, {})
    assert options["ray_actor_options"]["runtime_env"] == {"env_vars": {"GRPC_EXPERIMENTS": "-event_engine_client"}}
    assert GatewayDeployment.options(**options).ray_actor_options["runtime_env"]["env_vars"] == \
        {"GRPC_EXPERIMENTS": "-event_engine_client"}
    assert gateway_env({"GRPC_EXPERIMENTS": "-chaotic_good"}) == \
        {"GRPC_EXPERIMENTS": "-chaotic_good,-event_engine_client"}  # the operator's others are kept
    for chosen in ("event_engine_client", "-event_engine_client", "foo,event_engine_client"):
        assert gateway_env({"GRPC_EXPERIMENTS": chosen}) == {}  # theirs, job-wide, stands


def test_what_the_head_offers_ray():
    flags = start_flags("--node-num-cpus", "6", "--node-memory", "8GiB")
    assert flags == {"num_cpus": 6.0, "memory": 8 * 2**30, "ray_monitor": True}
    cmd = head_node(PlatformConfig(models_on_head=False, **flags), {}).command()
    assert flag_value(cmd, "--num-cpus") == "6" and flag_value(cmd, "--memory") == str(8 * 2**30)
    default = head_node(PlatformConfig(models_on_head=False, **start_flags()), {}).command()
    assert flag_value(default, "--num-cpus") == str(4 * (os.cpu_count() or 2)) and "--memory" not in default
    assert flag_value(head_node(PlatformConfig(models_on_head=False, **start_flags("--node-num-cpus", "3.0")),
                                {}).command(), "--num-cpus") == "3"


@pytest.mark.parametrize(("argv", "key", "problem"), [
    (["--node-memory", "lots"], "--node-memory", "not a size: 'lots'"),  # join's parse, join's message
    (["--node-num-cpus", "0"], "--node-num-cpus", "not a whole number of CPUs >= 1"),
    (["--node-num-cpus", "2.5"], "--node-num-cpus", "2.5 is not a whole number"),  # `ray start` takes ints only
    (["--node-num-cpus", "nan"], "--node-num-cpus", "nan is not a whole number"),
    (["--ray-address", "auto", "--node-num-cpus", "4"], "--node-num-cpus", "--ray-address"),
    (["--ray-address", "auto", "--no-ray-monitor"], "--no-ray-monitor", "--ray-address"),
])
def test_bad_head_node_flags_name_the_flag(argv, key, problem):
    with pytest.raises(ConfigError) as e:
        start_flags(*argv)
    assert e.value.key == key and problem in str(e.value) and e.value.fix


def test_join_offers_whole_cpus_only(monkeypatch, capsys):
    assert joined_config(monkeypatch, "--node-num-cpus", "6").num_cpus == 6
    with pytest.raises(SystemExit) as done:
        main(["join", "--gcs-address", "127.0.0.1:1", "--no-metrics", "--node-num-cpus", "2.5"])
    assert done.value.code == 2 and "--node-num-cpus: 2.5 is not a whole number" in capsys.readouterr().err


def test_join_memory_parses_the_same_way(monkeypatch, capsys):
    assert joined_config(monkeypatch, "--node-memory", "512M").memory == 512 * 2**20
    with pytest.raises(SystemExit) as done:
        main(["join", "--gcs-address", "127.0.0.1:1", "--no-metrics", "--node-memory", "lots"])
    assert done.value.code == 2 and "--node-memory" in (err := capsys.readouterr().err) and "'lots'" in err


def test_no_node_runs_rays_log_monitor():
    """No driver of the platform takes logs; its tail of every log file would run beside the engines."""
    for node in (NodeConfig(head=True), NodeConfig(head=False, gcs_address="10.0.0.1:6380")):
        cmd = node.command()
        assert cmd[cmd.index("--include-log-monitor") + 1] == "false"


def test_no_ray_monitor_starts_the_head_without_the_monitor():
    flags = start_flags("--no-ray-monitor")
    assert flags["ray_monitor"] is False
    assert "--no-monitor" in head_node(PlatformConfig(models_on_head=False, **flags), {}).command()
    assert "--no-monitor" not in head_node(PlatformConfig(models_on_head=False), {}).command()


def test_the_gcs_redis_password_goes_on_the_head_command_line_only_with_the_redis_address():
    cmd = head_node(PlatformConfig(models_on_head=False), GCS_REDIS).command()
    assert flag_value(cmd, "--redis-password") == "s3cret" and "--head" in cmd
    without_address = head_node(PlatformConfig(models_on_head=False), {ENV_GCS_REDIS_PASSWORD: "s3cret"})
    assert "--redis-password" not in without_address.command()
    without_password = head_node(PlatformConfig(models_on_head=False), {ENV_GCS_REDIS_ADDRESS: "r:6379"})
    assert "--redis-password" not in without_password.command()
    joiner = NodeConfig(head=False, gcs_address="10.0.0.1:6380", redis_password="s3cret")
    assert "--redis-password" not in joiner.command()


def test_the_head_node_inherits_the_gcs_redis_environment():
    base = {"PATH": "/bin", **GCS_REDIS, ENV_GCS_STORAGE_NAMESPACE: "rc-uid-1"}
    env = head_node(PlatformConfig(models_on_head=False), base).env(base)
    assert env[ENV_GCS_REDIS_ADDRESS] == "redis.ns.svc:6379" and env[ENV_GCS_STORAGE_NAMESPACE] == "rc-uid-1"


def test_a_redis_the_head_cannot_use_is_named_without_the_password(monkeypatch):
    # What Ray 2.60 prints (then a C++ stack trace) when the GCS's Redis refuses the password.
    line = ("[2026-01-01 00:00:00,157 C 1 1] (ray_init) redis_store_client.cc:141: Check failed: "
            "primary_context_->Connect(options.ip, options.port, options.username, options.password, "
            "options.enable_ssl) Status not OK: RedisError: WRONGPASS invalid username-password pair or user is "
            "disabled. Failed to connect to Redis.")
    script = f"print({line!r}); print('/lib/libc.so.6(+0x2724a)'); raise SystemExit(1)"
    monkeypatch.setattr(NodeConfig, "command", lambda self: [sys.executable, "-c", script])
    node = RayNode(NodeConfig(head=True, redis_password="s3cret"), env={**os.environ, **GCS_REDIS})
    with pytest.raises(NodeStartError) as failed:
        node.wait_started(30)
    node.stop(grace_s=1)
    message = str(failed.value)
    assert failed.value.kind == "redis" and "s3cret" not in message
    assert f"{ENV_GCS_REDIS_ADDRESS}=redis.ns.svc:6379" in message and "WRONGPASS" in message
    assert ENV_GCS_REDIS_PASSWORD in message and "stack" not in message.lower()


def test_the_agent_port_is_the_one_given_or_a_free_one() -> None:
    """`--dashboard-agent-port`: Kubernetes probes ask Ray's agent there; by default each node picks
    a free port, so that several nodes can share one machine."""
    from services.cluster.ray_node import NodeConfig

    def agent(cfg: NodeConfig) -> int:
        cmd = cfg.command()
        return int(cmd[cmd.index("--dashboard-agent-listen-port") + 1])

    assert agent(NodeConfig(head=False, gcs_address="h:6380", agent_port=52365)) == 52365
    assert agent(NodeConfig(head=True, agent_port=52366)) == 52366
    free = {agent(NodeConfig(head=False, gcs_address="h:6380", node_ip="127.0.0.1")) for _ in range(3)}
    assert 52365 not in free and all(0 < p < 65536 for p in free)
