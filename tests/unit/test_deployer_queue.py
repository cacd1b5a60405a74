"""The real Deployer against a fake Serve: one deploy at a time, queueing, cancel back to the set
before the deploy, supersede, the event stream, and the bounded deploy log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deploy_log import DeployRecord, DeployRecords
from services.coordinator.fingerprint import app_name, version_of
from tests.helpers import until
from tests.serve_control_fake import DeployRig, messages, phases
from tests.serve_control_fake import model_spec as spec


@pytest.fixture
async def rig() -> AsyncIterator[DeployRig]:
    async with DeployRig() as rig:
        yield rig


async def test_a_cancelled_scale_up_goes_back_and_the_queued_deploy_then_runs(rig):
    await rig.deploy(spec("a"))
    app = app_name(spec("a"))
    rig.serve.hold("a")  # the scale-up's replicas are still loading
    scale_up = rig.start(spec("a", replicas=3))
    await until(lambda: rig.serve.apps[app].target == 3, "the scale-up is under way")
    queued = rig.start(spec("a", replicas=2))
    await until(lambda: len(messages(queued)) == 1, "the second deploy says it waits")
    assert messages(queued) == [f"queued behind deploy {scale_up.deploy_id}; it runs when that one ends "
                                "(or deploy with --supersede to cancel that one)"]
    assert queued.state == pb.DEPLOY_STATE_QUEUED

    cancelled = await rig.deployer.cancel(scale_up.deploy_id)
    assert cancelled is scale_up and scale_up.state == pb.DEPLOY_STATE_CANCELLED and scale_up.error == "cancelled"
    assert "cancelled: going back to the set that ran before this deploy" in messages(scale_up)
    assert rig.serve.calls[1:3] == [("rescale", app, 3), ("rescale", app, 1)]  # back to the committed count

    await rig.serve.release("a")
    await asyncio.wait({queued.task})
    assert queued.state == pb.DEPLOY_STATE_SUCCEEDED and rig.serve.apps[app].target == 2
    assert rig.serve.app_of("a") == [app]  # never reloaded
    assert [[s.num_replicas for s in models] for models in rig.commits] == [[1], [2]]


async def test_a_cancelled_new_version_is_deleted_once_submitted_and_the_old_one_serves(rig):
    await rig.deploy(spec("a"))
    rig.serve.hold("a")  # the new version loads (its app is submitted, not running)
    record = rig.start(spec("a", 768))
    new_app = app_name(spec("a", 768))
    await until(lambda: new_app in rig.serve.apps, "the new version is submitted")
    await rig.deployer.cancel(record.deploy_id)
    assert record.state == pb.DEPLOY_STATE_CANCELLED
    assert ("delete", new_app) in rig.serve.calls and rig.serve.app_of("a") == [app_name(spec("a"))]
    assert rig.route("a") == version_of(spec("a")) and len(rig.commits) == 1


async def test_the_shielded_submit_finishes_before_the_restore_deletes_its_apps(rig):
    submitted = asyncio.Event()
    real_submit = rig.serve.submit

    async def slow_submit(apps, coordinator):  # Serve's call, in a thread a cancel cannot stop
        await submitted.wait()
        await real_submit(apps, coordinator)

    rig.serve.submit = slow_submit
    record = rig.start(spec("a"))
    await until(lambda: record.models.get("a") is not None, "the deploy scheduled its model")
    cancelling = asyncio.create_task(rig.deployer.cancel(record.deploy_id))
    await until(lambda: record.cancelling, "the cancel is under way")
    assert not cancelling.done()  # the restore waits for the submit
    submitted.set()
    await cancelling
    assert rig.serve.calls == [("submit", app_name(spec("a"))), ("delete", app_name(spec("a")))]
    assert rig.serve.apps == {} and record.state == pb.DEPLOY_STATE_CANCELLED


async def test_a_deploy_cancelled_while_queued_runs_nothing(rig):
    rig.serve.hold("a")
    first = rig.start(spec("a"))
    second = rig.start(spec("b"))
    await until(lambda: messages(second), "the second deploy is queued")
    await rig.deployer.cancel(second.deploy_id)
    assert second.state == pb.DEPLOY_STATE_CANCELLED and messages(second)[-1] == "cancelled while queued"
    await rig.serve.release("a")
    await asyncio.wait({first.task})
    assert first.state == pb.DEPLOY_STATE_SUCCEEDED and rig.serve.app_of("b") == []


async def test_supersede_cancels_the_running_deploy_first(rig):
    rig.serve.hold("a")
    first = rig.start(spec("a"))
    await until(lambda: app_name(spec("a")) in rig.serve.apps, "the first deploy loads")
    second = rig.start(spec("b"), supersede=True)
    await asyncio.wait({second.task})
    assert messages(second)[0] == f"superseding deploy {first.deploy_id}"
    assert not any(m.startswith("queued behind") for m in messages(second))
    assert first.state == pb.DEPLOY_STATE_CANCELLED and second.state == pb.DEPLOY_STATE_SUCCEEDED
    assert rig.serve.app_of("a") == [] and [m.spec.name for m in rig.deployer.running_models()] == ["b"]


async def test_following_a_deploy_replays_its_events_then_ends_with_it(rig):
    rig.serve.hold("a")
    record = rig.start(spec("a"))
    await until(lambda: app_name(spec("a")) in rig.serve.apps, "the deploy loads")
    follower = asyncio.create_task(_collect(record))
    await rig.serve.release("a")
    events = await asyncio.wait_for(follower, 5)
    assert [e.state for e in events][-1] == pb.DEPLOY_STATE_SUCCEEDED
    assert [e.model.phase for e in events if e.HasField("model")] == [
        pb.MODEL_PHASE_SCHEDULED, pb.MODEL_PHASE_LOADING, pb.MODEL_PHASE_READY]
    assert events == await _collect(record)  # a late follower gets the whole stream, then the end


async def test_get_and_cancel_of_unknown_deploys(rig):
    assert rig.deployer.get("nope") is None and rig.deployer.get() is None
    assert await rig.deployer.cancel("nope") is None and await rig.deployer.cancel("") is None
    record = await rig.deploy(spec("a"))
    assert rig.deployer.get() is record and rig.deployer.get(record.deploy_id) is record
    assert await rig.deployer.cancel(record.deploy_id) is record and record.state == pb.DEPLOY_STATE_SUCCEEDED


async def test_the_deploy_log_keeps_the_last_finished_deploys():
    async with DeployRig(keep_finished=3) as rig:
        done = [await rig.deploy(spec("a", replicas=n)) for n in range(1, 6)]
        assert len(rig.deployer.records) <= 4  # the last 3 finished (+ the newest, until the next start)
        assert rig.deployer.get(done[0].deploy_id) is None and rig.deployer.get() is done[-1]
        assert all(rig.deployer.get(r.deploy_id) is r for r in done[-3:])
        assert phases(done[-1]) == {"a": pb.MODEL_PHASE_RESCALED}


async def test_pruning_never_drops_a_queued_or_running_deploy():
    records = DeployRecords(keep_finished=2)
    running = DeployRecord(task=asyncio.create_task(asyncio.Event().wait()))
    records.add(running)
    finished = [DeployRecord(state=pb.DEPLOY_STATE_SUCCEEDED) for _ in range(4)]
    for record in finished:
        records.add(record)
    assert records.get(running.deploy_id) is running and records.in_flight() == [running]
    assert [records.get(r.deploy_id) for r in finished] == [None, None, *finished[2:]]
    running.task.cancel()


async def _collect(record: DeployRecord) -> list[pb.DeployEvent]:
    return [event async for event in record.follow()]


async def test_a_superseding_deploy_cancelled_while_it_waits_ends_cancelled(rig):
    rig.serve.hold("a")
    first = rig.start(spec("a"))
    await until(lambda: app_name(spec("a")) in rig.serve.apps, "the first deploy loads")
    gate, delete = asyncio.Event(), rig.serve.delete

    async def slow_delete(name: str) -> None:  # the first deploy's restore takes its time
        await gate.wait()
        await delete(name)
    rig.serve.delete = slow_delete  # type: ignore[method-assign]
    second = rig.start(spec("b"), supersede=True)
    await until(lambda: first.cancelling, "the second deploy to cancel the first")
    await rig.deployer.cancel(second.deploy_id, wait_s=5)
    assert second.state == pb.DEPLOY_STATE_CANCELLED and second.task.done()
    assert [e.state for e in await asyncio.wait_for(_collect(second), 5)][-1] == pb.DEPLOY_STATE_CANCELLED
    gate.set()
    await asyncio.wait({first.task})
    assert first.state == pb.DEPLOY_STATE_CANCELLED and rig.serve.app_of("b") == []
