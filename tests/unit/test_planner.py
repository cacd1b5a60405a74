"""The pure planner: the running set and a deploy request in, what changes out."""

from __future__ import annotations

import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.fingerprint import app_name, version_of
from services.coordinator.planner import DEFAULT_DRAIN_TIMEOUT_S, RunningModel, needs_serve_targets, plan_deploy
from tests.serve_control_fake import model_spec as spec


def running(*specs: common_pb2.ModelSpec) -> dict[str, RunningModel]:
    return {s.name: RunningModel(s, version_of(s), app_name(s)) for s in specs}


def request(*specs: common_pb2.ModelSpec, reconcile: bool = False,
            drain_timeout_s: float | None = None) -> pb.DeployRequest:
    mode = pb.DEPLOY_MODE_RECONCILE if reconcile else pb.DEPLOY_MODE_ADDITIVE
    return pb.DeployRequest(models=specs, mode=mode, drain_timeout_s=drain_timeout_s)


def test_new_models_and_new_versions_are_added_the_same_config_is_unchanged():
    now = running(spec("a"), spec("b"))
    plan = plan_deploy(now, request(spec("a"), spec("b", max_model_len=768), spec("c")), {})
    assert sorted(plan.add) == ["b", "c"] and plan.unchanged == ["a"]
    assert plan.add["b"][1] == version_of(spec("b", max_model_len=768)) != now["b"].version
    assert not plan.rescale and not plan.remove and plan.drain_timeout_s == DEFAULT_DRAIN_TIMEOUT_S


def test_a_scale_change_rescales_in_place():
    plan = plan_deploy(running(spec("a"), spec("b")), request(spec("a", replicas=3), spec("b", autoscaled=True)), {})
    assert sorted(plan.rescale) == ["a", "b"] and plan.rescale["a"].num_replicas == 3
    assert not plan.add and not plan.unchanged


def test_additive_keeps_what_the_request_omits_reconcile_removes_it():
    now = running(spec("a"), spec("b"), spec("c"))
    assert plan_deploy(now, request(spec("a")), {}).remove == []
    assert plan_deploy(now, request(spec("a"), reconcile=True, drain_timeout_s=5), {}).remove == ["b", "c"]
    assert plan_deploy(now, request(reconcile=True, drain_timeout_s=5), {}).drain_timeout_s == 5


def test_a_drain_timeout_of_zero_is_no_drain_an_unset_one_the_default():
    now = running(spec("a"))
    assert plan_deploy(now, request(spec("a", 768), drain_timeout_s=0), {}).drain_timeout_s == 0
    assert plan_deploy(now, request(spec("a", 768)), {}).drain_timeout_s == DEFAULT_DRAIN_TIMEOUT_S


def test_a_drifted_fixed_count_is_restored_an_autoscaled_one_floats():
    now = running(spec("a", replicas=2), spec("b", autoscaled=True))
    targets = {now["a"].app: 1, now["b"].app: 3}
    plan = plan_deploy(now, request(spec("a", replicas=2), spec("b", autoscaled=True)), targets)
    assert list(plan.rescale) == ["a"] and plan.rescale["a"].num_replicas == 2 and plan.unchanged == ["b"]
    in_step = plan_deploy(now, request(spec("a", replicas=2)), {now["a"].app: 2})
    assert in_step.unchanged == ["a"] and not in_step.rescale


def test_serve_is_asked_for_targets_only_when_a_fixed_count_runs():
    assert not needs_serve_targets({})
    assert not needs_serve_targets(running(spec("b", autoscaled=True)))
    assert needs_serve_targets(running(spec("a"), spec("b", autoscaled=True)))


def test_a_rate_limit_change_is_no_new_version_and_no_reload():
    limited = spec("a")
    limited.rate_limits.requests_per_minute = 60
    assert version_of(limited) == version_of(spec("a"))
    plan = plan_deploy(running(spec("a")), request(limited), {})
    assert list(plan.relimit) == ["a"] and plan.relimit["a"].rate_limits.requests_per_minute == 60
    assert not plan.add and not plan.rescale and not plan.unchanged
    both = spec("a", replicas=3)
    both.rate_limits.tokens_per_minute = 1000
    plan = plan_deploy(running(spec("a")), request(both), {})
    assert plan.rescale["a"].rate_limits.tokens_per_minute == 1000 and not plan.relimit


@pytest.mark.parametrize("field", ["max_ongoing_requests", "max_queued_requests"])
def test_a_backpressure_change_is_no_new_version_and_no_reload(field):
    limited = spec("a")
    setattr(limited, field, 0 if field == "max_queued_requests" else 3)  # set, even to 0, differs from unset
    assert version_of(limited) == version_of(spec("a"))
    plan = plan_deploy(running(spec("a")), request(limited), {})
    assert list(plan.relimit) == ["a"] and plan.relimit["a"].HasField(field)
    assert not plan.add and not plan.rescale and not plan.unchanged
