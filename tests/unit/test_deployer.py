"""The real Deployer against a fake Serve: apply, blue-green switch with drain, rescale in place,
rollback of a failed version or rescale, drift, reconcile and the committed set."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.fingerprint import app_name, version_of
from tests.helpers import until
from tests.serve_control_fake import DeployRig, messages, phases
from tests.serve_control_fake import model_spec as spec

Phase = pb.ModelPhase
SERVE_FAILURE = """The deployment failed to start 3 times in a row. This may be due to a problem with its \
constructor or initial health check failing. Error:
Traceback (most recent call last):
  File "/work/services/worker/host.py", line 52, in resolve_model
FileNotFoundError: model path /nope does not exist on this node"""


@pytest.fixture
async def rig() -> AsyncIterator[DeployRig]:
    async with DeployRig() as rig:
        yield rig


async def test_a_new_model_loads_routes_and_is_committed(rig):
    record = await rig.deploy(spec("a", replicas=2))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and record.error == ""
    assert phases(record) == {"a": Phase.MODEL_PHASE_READY}
    app = app_name(spec("a"))
    assert rig.serve.calls == [("submit", app)]
    assert rig.route("a") == version_of(spec("a")) and len(rig.registry.live("a", rig.route("a"))) == 2
    assert [m.app for m in rig.deployer.running_models()] == [app]
    assert rig.commits == [[spec("a", replicas=2)]]
    assert messages(record)[0] == "started" and messages(record)[-1] == "done"


async def test_the_same_config_again_changes_nothing(rig):
    await rig.deploy(spec("a"))
    record = await rig.deploy(spec("a"))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and phases(record) == {"a": Phase.MODEL_PHASE_UNCHANGED}
    assert rig.serve.calls == [("submit", app_name(spec("a")))]


async def test_a_new_version_switches_then_the_old_one_drains_and_goes(rig):
    await rig.deploy(spec("a"))
    old_app, v1, v2 = app_name(spec("a")), version_of(spec("a")), version_of(spec("a", 768))
    (old_replica,) = rig.registry.live("a", v1)
    rig.serve.inflight[old_replica.replica_id] = 2  # calls still in flight on the old version
    record = rig.start(spec("a", 768), drain_timeout_s=30)
    await until(lambda: rig.route("a") == v2, "the route switches to the new version")
    assert record.models["a"].phase == Phase.MODEL_PHASE_READY and not record.finished
    assert old_app in rig.serve.apps  # draining: not deleted while its calls run
    rig.serve.inflight[old_replica.replica_id] = 0
    await asyncio.wait({record.task})
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED
    assert rig.serve.calls[1:] == [("submit", app_name(spec("a", 768))), ("delete", old_app)]
    assert rig.serve.app_of("a") == [app_name(spec("a", 768))] and rig.registry.live("a", v1) == []


async def test_a_failed_version_is_torn_down_and_the_old_one_keeps_serving(rig):
    await rig.deploy(spec("a"))
    rig.serve.fail("/nope", SERVE_FAILURE)
    record = await rig.deploy(spec("a", 768, model="/nope"))
    assert record.state == pb.DEPLOY_STATE_FAILED and phases(record) == {"a": Phase.MODEL_PHASE_FAILED}
    assert record.error == ("a: The deployment failed to start 3 times in a row: "
                            "FileNotFoundError: model path /nope does not exist on this node")  # shortened
    failed_app = app_name(spec("a", 768, model="/nope"))
    assert rig.serve.calls[-2:] == [("submit", failed_app), ("delete", failed_app)]
    assert rig.route("a") == version_of(spec("a")) and rig.serve.app_of("a") == [app_name(spec("a"))]
    assert rig.commits == [[spec("a")]]  # nothing changed: the committed set stays


async def test_a_partial_failure_commits_what_runs_now(rig):
    rig.serve.fail("/nope", SERVE_FAILURE)
    record = await rig.deploy(spec("a"), spec("b", model="/nope"))
    assert record.state == pb.DEPLOY_STATE_FAILED and record.error.startswith("b: ")
    assert phases(record) == {"a": Phase.MODEL_PHASE_READY, "b": Phase.MODEL_PHASE_FAILED}
    assert rig.commits == [[spec("a")]]


async def test_a_scale_change_rescales_in_place(rig):
    await rig.deploy(spec("a"))
    app = app_name(spec("a"))
    (first,) = rig.registry.live("a", version_of(spec("a")))
    record = await rig.deploy(spec("a", replicas=3))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and phases(record) == {"a": Phase.MODEL_PHASE_RESCALED}
    assert rig.serve.calls[1:] == [("rescale", app, 3)]
    live = rig.registry.live("a", version_of(spec("a")))
    assert len(live) == 3 and first in live  # the running replica stayed
    assert record.models["a"].ready_replicas == 3 == record.models["a"].target_replicas
    assert rig.commits[-1] == [spec("a", replicas=3)]


async def test_an_autoscaling_change_redeploys_the_same_app(rig):
    await rig.deploy(spec("a"))
    record = await rig.deploy(spec("a", autoscaled=True))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and phases(record) == {"a": Phase.MODEL_PHASE_RESCALED}
    assert rig.serve.calls[1:] == [("submit", app_name(spec("a")))]


async def test_a_rescale_that_is_not_reached_in_time_goes_back_to_the_old_count():
    async with DeployRig(load_timeout_s=0.05) as rig:
        await rig.deploy(spec("a"))
        app = app_name(spec("a"))
        rig.serve.hold("a")  # the new replicas never come up
        record = await rig.deploy(spec("a", replicas=2))
        assert record.state == pb.DEPLOY_STATE_FAILED
        assert record.error == "a: the replica count was not reached in time"
        assert rig.serve.calls[1:] == [("rescale", app, 2), ("rescale", app, 1)]
        assert [m.spec.num_replicas for m in rig.deployer.running_models()] == [1]
        assert rig.commits == [[spec("a")]]


async def test_the_same_config_restores_a_drifted_replica_count(rig):
    await rig.deploy(spec("a", replicas=2))
    app = app_name(spec("a"))
    await rig.serve.drift(app, 1)
    record = await rig.deploy(spec("a", replicas=2))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and phases(record) == {"a": Phase.MODEL_PHASE_RESCALED}
    assert rig.serve.calls[-1] == ("rescale", app, 2) and rig.serve.apps[app].target == 2
    assert len(rig.registry.live("a", version_of(spec("a")))) == 2


async def test_reconcile_stops_routing_then_removes_what_the_set_omits(rig):
    await rig.deploy(spec("a"), spec("b"))
    record = await rig.deploy(spec("a"), reconcile=True)
    assert phases(record) == {"a": Phase.MODEL_PHASE_UNCHANGED, "b": Phase.MODEL_PHASE_REMOVED}
    assert rig.route("b") is None and rig.serve.app_of("b") == []
    assert rig.serve.calls[-1] == ("delete", app_name(spec("b")))
    assert [m.spec.name for m in rig.deployer.running_models()] == ["a"] and rig.commits[-1] == [spec("a")]


async def test_use_committed_brings_back_the_stored_set(rig):
    await rig.deploy(spec("a"), spec("b"))
    rig.commits.append([spec("a")])  # the state service holds another set (e.g. after a restart)
    record = await rig.deploy(use_committed=True)
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and "the committed set: a" in messages(record)
    assert [m.spec.name for m in rig.deployer.running_models()] == ["a"]


async def test_a_commit_that_fails_fails_the_deploy_and_closes_its_record(rig):
    rig.commit_error = ConnectionError("state service down")
    record = await rig.deploy(spec("a"))
    assert record.state == pb.DEPLOY_STATE_FAILED and "state service down" in record.error
    assert record.events.closed and rig.route("a") == version_of(spec("a"))  # what runs stays


async def test_a_serve_failure_while_loading_stops_the_other_models_of_the_deploy(rig):
    await rig.deploy(spec("b"))
    old_b = rig.route("b")
    wait_app = rig.serve.wait_app

    async def broken_for_a(name: str, timeout_s: float):
        if name == app_name(spec("a")):
            raise RuntimeError("the Serve controller went away")
        return await wait_app(name, timeout_s)
    rig.serve.wait_app = broken_for_a  # type: ignore[method-assign]
    rig.serve.hold("b")
    record = await rig.deploy(spec("a"), spec("b", max_model_len=1024))
    assert record.state == pb.DEPLOY_STATE_FAILED and "controller went away" in record.error
    new_b = app_name(spec("b", max_model_len=1024))
    assert new_b not in rig.serve.apps  # what never switched is torn down...
    await rig.serve.release("b")
    assert rig.route("b") == old_b  # ...and nothing switches routes for the failed deploy later
    assert [m.version for m in rig.deployer.running_models() if m.spec.name == "b"] == [old_b]


async def test_a_serve_failure_after_a_switch_still_commits_what_serves(rig):
    await rig.deploy(spec("a"), spec("b"))
    delete = rig.serve.delete

    async def delete_fails_for_a_v1(name: str) -> None:  # Serve's controller fails the old version's delete
        if name == app_name(spec("a")):
            raise RuntimeError("controller unavailable")
        await delete(name)

    rig.serve.delete = delete_fails_for_a_v1  # type: ignore[method-assign]
    record = await rig.deploy(spec("a", 768))
    assert record.state == pb.DEPLOY_STATE_FAILED and "controller unavailable" in record.error
    assert rig.route("a") == version_of(spec("a", 768))
    assert sorted((s.name, s.max_model_len) for s in rig.commits[-1]) == [("a", 768), ("b", 512)]


async def test_a_cancel_while_the_set_is_committed_is_too_late_the_deploy_succeeds(rig):
    writing, write = asyncio.Event(), asyncio.Event()
    commit = rig.deployer._commit

    async def slow_commit(models, deploy_id) -> None:  # e.g. the state service's Redis failing over
        writing.set()
        await write.wait()
        await commit(models, deploy_id)

    rig.deployer._commit = slow_commit
    record = rig.start(spec("a"))
    await asyncio.wait_for(writing.wait(), 5)
    cancel = asyncio.create_task(rig.deployer.cancel(record.deploy_id))
    await asyncio.sleep(0)
    write.set()
    assert await asyncio.wait_for(cancel, 5) is record
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED and messages(record)[-1] == "done"
    assert [s.name for s in rig.commits[-1]] == ["a"] and rig.route("a") == version_of(spec("a"))


async def test_a_cancel_that_cannot_go_back_says_so_and_commits_what_serves():
    async with DeployRig(load_timeout_s=0.3) as rig:
        v1, v2 = spec("a", model="builtin:one"), spec("a", 768, model="builtin:two")
        await rig.deploy(v1)
        rig.serve.hold("b")  # the deploy goes on loading b after a switched
        record = rig.start(v2, spec("b"))
        await until(lambda: rig.serve.app_of("a") == [app_name(v2)], "a switched to v2, v1 deleted")
        rig.serve.fail("builtin:one", "out of memory")  # v1 cannot come back now
        await rig.deployer.cancel(record.deploy_id)
        assert record.state == pb.DEPLOY_STATE_CANCELLED
        assert record.error.startswith("cancelled; going back failed for a")
        assert rig.route("a") == version_of(v2) and [s.model for s in rig.commits[-1]] == ["builtin:two"]


async def test_a_failed_rescale_keeps_its_count_and_the_other_models_still_deploy():
    async with DeployRig(load_timeout_s=0.3) as rig:
        await rig.deploy(spec("a"))
        rig.serve.hold("a")  # a's second replica never comes up
        record = await rig.deploy(spec("a", replicas=2), spec("b"))
        assert record.state == pb.DEPLOY_STATE_FAILED
        assert phases(record) == {"a": Phase.MODEL_PHASE_FAILED, "b": Phase.MODEL_PHASE_READY}
        assert rig.route("b") == version_of(spec("b"))
        assert sorted((s.name, s.num_replicas) for s in rig.commits[-1]) == [("a", 1), ("b", 1)]


async def test_a_failed_autoscaling_change_goes_back_in_serve_too():
    async with DeployRig(load_timeout_s=0.3) as rig:
        await rig.deploy(spec("a", autoscaled=True))
        wider = spec("a", autoscaled=True)
        wider.autoscaling.min_replicas = 2
        rig.serve.hold("a")
        record = await rig.deploy(wider)
        assert record.state == pb.DEPLOY_STATE_FAILED
        assert rig.deployer.running_models()[0].spec.autoscaling.min_replicas == 1
        assert rig.serve.apps[app_name(wider)].spec.autoscaling.min_replicas == 1


async def test_use_committed_with_no_stored_set_keeps_what_runs_and_commits_it(rig):
    await rig.deploy(spec("a"), spec("b"))
    rig.commits.clear()  # the state service lost the committed set (memory://, restarted)
    record = await rig.deploy(reconcile=True, use_committed=True)
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED
    assert messages(record)[1].startswith("no committed set is stored")
    assert sorted(rig.serve.apps) == sorted(app_name(spec(n)) for n in "ab")
    assert [s.name for s in rig.commits[-1]] == ["a", "b"]


async def test_a_committed_replica_count_of_zero_restores_one_replica(rig):
    """A set stored before the coordinator normalized `num_replicas` 0 (the field unset) to 1."""
    from mship.common.v1 import common_pb2

    unset = common_pb2.ModelSpec(name="z", model="builtin:tiny-qwen2")
    rig.commits.append([unset])
    record = await rig.deploy(reconcile=True, use_committed=True)
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED
    assert len(rig.registry.live("z", version_of(unset))) == 1 and rig.commits[-1][0].num_replicas == 1
