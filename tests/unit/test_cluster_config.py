"""What `mship start` / `mship join` decide before anything starts: token rules, --env-file,
capabilities (probe and MSHIP_NODE_CAPABILITIES), addresses handed to services (never 0.0.0.0),
the Ray node command lines, and taken ports named with their flag."""

from __future__ import annotations

import signal
import socket

import pytest

from clients import node_commands
from clients.cli import main
from clients.env_file import parse_env_file
from clients.modelset import ConfigError
from clients.node_flags import parse_memory
from services import launcher
from services.cluster import capabilities
from services.cluster.ports import PortTaken, check_free
from services.cluster.ray_node import NodeConfig
from services.common.vocabulary import ENV_CACHE_DIR, ENV_NODE_CAPABILITIES, ENV_RAY_AUTH_TOKEN
from services.launcher import PlatformConfig


def run_cli(*argv: str) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return int(done.value.code)


def test_start_refuses_a_token_without_auth_and_auth_without_a_token(monkeypatch, capsys):
    monkeypatch.setenv(ENV_RAY_AUTH_TOKEN, "t0ken")
    assert run_cli("start") == 2
    assert "--enable-ray-auth" in capsys.readouterr().err
    monkeypatch.delenv(ENV_RAY_AUTH_TOKEN)
    assert run_cli("start", "--enable-ray-auth") == 2
    assert ENV_RAY_AUTH_TOKEN in capsys.readouterr().err


def test_env_file_supplies_the_token(tmp_path, monkeypatch, capsys):
    for name in (ENV_RAY_AUTH_TOKEN, "MSHIP_OTHER"):  # set first, so monkeypatch restores them afterwards:
        monkeypatch.setenv(name, "")                 # the CLI loads the file into os.environ
        monkeypatch.delenv(name)
    env = tmp_path / "cluster.env"
    env.write_text(f"# the cluster\nexport {ENV_RAY_AUTH_TOKEN}='abc def'\nMSHIP_OTHER = 1\n\n")
    assert parse_env_file(str(env)) == {ENV_RAY_AUTH_TOKEN: "abc def", "MSHIP_OTHER": "1"}
    env.chmod(0o644)
    # A token from the file without --enable-ray-auth: refused as such (so the file was read), with a
    # warning that others can read the secret.
    assert run_cli("start", "--env-file", str(env)) == 2
    err = capsys.readouterr().err
    assert "readable by other users" in err and "--enable-ray-auth" in err
    env.write_text("not a line\n")
    with pytest.raises(ConfigError, match="line 1"):
        parse_env_file(str(env))


def test_join_refuses_more_gpus_than_the_node_sees(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert run_cli("join", "--gcs-address", "127.0.0.1:1", "--node-num-gpus", "1") == 2
    assert "--node-num-gpus" in capsys.readouterr().err


@pytest.mark.parametrize("text, expected", [('["vllm"]', ["vllm"]), ("[]", []), ('["vllm", "vllm"]', ["vllm"]),
                                            ('["llama_cpp", "vllm"]', ["llama_cpp", "vllm"])])
def test_capabilities_override(text, expected):
    assert capabilities.node_capabilities({ENV_NODE_CAPABILITIES: text}) == expected


@pytest.mark.parametrize("text, problem", [("vllm", "JSON list"), ('{"vllm": 1}', "JSON list"),
                                           ('["tensorrt"]', "unknown loader")])
def test_bad_capabilities_are_refused(text, problem):
    with pytest.raises(capabilities.CapabilityError, match=problem):
        capabilities.node_capabilities({ENV_NODE_CAPABILITIES: text})


def test_capabilities_become_ray_resources_and_back():
    # this machine has vllm and torch installed, the packaged llama-server runs, and the speech extra is in
    assert capabilities.node_capabilities({}) == ["faster_whisper", "llama_cpp", "piper", "vllm"]
    res = capabilities.resources(["vllm"])
    assert res == {"mship_vllm": capabilities.SLOTS}
    assert capabilities.capabilities_of({"CPU": 4, **res}) == ["vllm"] and capabilities.capabilities_of({}) == []


def test_no_address_handed_to_services_is_a_wildcard():
    wildcard = PlatformConfig(host="0.0.0.0")
    assert not wildcard.coordinator_address.startswith("0.0.0.0")
    assert not wildcard.state_address.startswith("0.0.0.0")
    assert PlatformConfig(host="127.0.0.1").coordinator_address == "127.0.0.1:50051"
    given = PlatformConfig(host="0.0.0.0", advertise_address="10.1.2.3", state_port=7)
    assert given.coordinator_address == "10.1.2.3:50051" and given.state_address == "10.1.2.3:7"
    assert PlatformConfig(host="10.9.8.7").state_address == "10.9.8.7:50052"


def test_ray_node_command_lines():
    head = NodeConfig(head=True, gcs_port=6390, node_ip="127.0.0.1", num_cpus=8.0, resources={"mship_vllm": 1000.0},
                      token="t", drain_timeout_s=0)
    cmd = head.command()
    assert cmd[cmd.index("--port") + 1] == "6390" and "--head" in cmd and "--block" in cmd
    assert cmd[cmd.index("--node-ip-address") + 1] == "127.0.0.1" and cmd[cmd.index("--num-cpus") + 1] == "8"
    assert cmd[cmd.index("--resources") + 1] == '{"mship_vllm": 1000.0}'
    env = head.env({"PATH": "/bin", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_TOKEN": "old"})
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "t"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env and env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    joiner = NodeConfig(head=False, gcs_address="10.0.0.1:6380", node_name="n2", num_gpus=1)
    cmd = joiner.command()
    assert cmd[cmd.index("--address") + 1] == "10.0.0.1:6380" and "--head" not in cmd and "--port" not in cmd
    assert cmd[cmd.index("--node-name") + 1] == "n2" and "--node-ip-address" not in cmd
    without = joiner.env({"RAY_AUTH_TOKEN": "stale"})
    assert "RAY_AUTH_TOKEN" not in without and without["RAY_AUTH_MODE"] == "disabled"  # explicit: no token


def test_a_taken_port_is_named_with_its_flag():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortTaken, match=f"port {port} .*--state-port"):
            check_free({"--http-port": ("127.0.0.1", 0), "--state-port": ("127.0.0.1", port)})


@pytest.mark.parametrize("text, expected", [("1024", 1024), ("8GiB", 8 * 2**30), ("512M", 512 * 2**20),
                                            ("1.5g", int(1.5 * 2**30))])
def test_node_memory_sizes(text, expected):
    assert parse_memory(text) == expected


@pytest.fixture
def no_platform(tmp_path, monkeypatch):
    """`mship start` may get as far as its platform only to fail the test: nothing of Ray starts here."""
    class Refused:
        def __init__(self, cfg) -> None:
            pass

        def start(self) -> None:
            pytest.fail("the platform started")

        def stop(self, *args) -> launcher.StopDeadline:
            return launcher.StopDeadline(1)

    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_NODE_CAPABILITIES, "[]")
    monkeypatch.setattr(launcher, "Platform", Refused)
    monkeypatch.setattr(node_commands, "_joined", lambda *a: pytest.fail("the node started"))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize(("flags", "flag"), [
    (["--http-port", "70000"], "--http-port"), (["--gcs-port", "65536"], "--gcs-port"),
    (["--state-port", "-1"], "--state-port"), (["--coordinator-port", "0"], "--coordinator-port"),
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--host", "::1"], "--host"), (["--host", "::"], "--host"), (["--advertise-address", "fe80::1"],
                                                                    "--advertise-address"),
])
def test_start_refuses_ports_out_of_range_and_ipv6_addresses_before_anything_starts(no_platform, capsys, flags, flag):
    assert run_cli("start", "--no-metrics" if flag != "--metrics-port" else "--stop-timeout=5", *flags) == 2
    assert f"{flag}:" in capsys.readouterr().err


def test_join_checks_its_metrics_port_and_address_before_anything_starts(no_platform, capsys):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run_cli("join", "--gcs-address", "10.0.0.1:6380", "--metrics-port", str(port)) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {port}" in err and "--metrics-port" in err
    # 192.0.2.1 (TEST-NET-1) is no address of this machine
    assert run_cli("join", "--gcs-address", "10.0.0.1:6380", "--no-metrics", "--advertise-address", "192.0.2.1") == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "192.0.2.1 is not an address of this machine" in err
    assert "--advertise-address" in err


@pytest.mark.parametrize(("content", "problem"), [(b"MSHIP_RAY_AUTH_TOKEN=\xff\xfeabc\n", "not UTF-8"),
                                                  (b"MSHIP_RAY_AUTH_TOKEN=a\x00b\n", "NUL")])
def test_an_env_file_that_cannot_be_loaded_is_a_config_error(tmp_path, capsys, content, problem):
    env = tmp_path / "bad.env"
    env.write_bytes(content)
    env.chmod(0o600)
    with pytest.raises(ConfigError, match=problem):
        parse_env_file(str(env))
    assert run_cli("models", "--env-file", str(env), "--coordinator", "127.0.0.1:1") == 2
    assert problem in capsys.readouterr().err
