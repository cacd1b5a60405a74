"""How replicas scale: the inflight policy both workers and gateways use, the Serve config it is
wired into, and `mship start`'s gateway flags (checked before anything starts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clients.cli import parser
from clients.modelset import ConfigError
from clients.node_flags import gateway_scaling
from services.common.autoscaling import POLICY, autoscaling_config, inflight_policy
from services.launcher import PlatformConfig, gateway_scale


def ctx(inflight: list[float], handle_requests: float = 0.0, target: float = 2.0) -> SimpleNamespace:
    return SimpleNamespace(aggregated_metrics={"inflight": {f"r{i}": n for i, n in enumerate(inflight)}},
                           total_num_requests=handle_requests, config=SimpleNamespace(target_ongoing_requests=target))


@pytest.mark.parametrize(("inflight", "handle", "want"), [
    ([3, 2], 0, 3),   # 5 in flight at 2 per replica
    ([0, 0], 0, 0),   # idle: as low as Serve's min_replicas lets it
    ([], 1, 1),       # at zero replicas a waiting wake call asks for one
    ([4], 0, 2),
])
def test_the_policy_wants_in_flight_calls_over_the_target(inflight, handle, want):
    assert inflight_policy(ctx(inflight, handle))[0] == want  # type: ignore[arg-type]


def test_a_deployment_at_min_zero_still_starts_one_replica_and_uses_the_policy():
    config = autoscaling_config(0, 3, 4.0, 1.0, 20.0)
    assert (config["initial_replicas"], config["min_replicas"], config["max_replicas"]) == (1, 0, 3)
    assert config["policy"] == {"policy_function": POLICY} and config["downscale_to_zero_delay_s"] == 20.0


def start_args(*argv: str):
    return parser().parse_args(["start", *argv])


def test_gateway_flags_give_a_fixed_count_or_autoscaling():
    assert gateway_scaling(start_args()) == {"gateway_replicas": 1}
    assert gateway_scaling(start_args("--gateway-replicas", "3")) == {"gateway_replicas": 3}
    scaled = gateway_scaling(start_args("--gateway-min-replicas", "2", "--gateway-max-replicas", "4",
                                        "--gateway-target-ongoing-requests", "8"))
    options = gateway_scale(PlatformConfig(**scaled))
    assert options["autoscaling_config"]["min_replicas"] == 2 and options["autoscaling_config"]["max_replicas"] == 4
    assert options["autoscaling_config"]["target_ongoing_requests"] == 8
    assert gateway_scale(PlatformConfig(gateway_replicas=2)) == {"num_replicas": 2}


@pytest.mark.parametrize(("argv", "key"), [
    (["--gateway-min-replicas", "0", "--gateway-max-replicas", "2"], "--gateway-min-replicas"),
    (["--gateway-min-replicas", "3", "--gateway-max-replicas", "2"], "--gateway-max-replicas"),
    (["--gateway-replicas", "2", "--gateway-max-replicas", "3"], "--gateway-replicas"),
    (["--gateway-replicas", "0"], "--gateway-replicas"),
    (["--gateway-max-replicas", "3", "--gateway-target-ongoing-requests", "0"], "--gateway-target-ongoing-requests"),
])
def test_bad_gateway_flags_name_the_flag(argv, key):
    with pytest.raises(ConfigError) as e:
        gateway_scaling(start_args(*argv))
    assert e.value.key == key and e.value.fix
