"""`DeliveredCall`: one Infer call read from its two streams, the call itself (its Final, or its
error) and the endpoint's delivery stream (its deltas), which are not ordered with each other.
Against scripted calls: every order of arrival is made to happen."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.common import delivery
from services.common.delivery import DeliveredCall, DeliveryReader
from services.common.errors import Reason, ServiceError
from tests.helpers import until


class ScriptedCall:
    """The call itself, as `DeliveredCall` reads it: `events` in turn (an exception is raised; an
    `asyncio.Event` is waited for)."""

    def __init__(self, *events: Any) -> None:
        self.events = list(events)

    async def read(self) -> Any:
        event = self.events.pop(0)
        if isinstance(event, asyncio.Event):
            await event.wait()
            event = self.events.pop(0)
        if isinstance(event, BaseException):
            raise event
        return event

    def cancel(self) -> bool:
        return True


def worker_error(delivered: int) -> grpc.aio.AioRpcError:
    """The error a worker's Infer ends with after sending `delivered` deltas on the stream."""
    failure = ServiceError(grpc.StatusCode.INTERNAL, Reason.ENGINE_ERROR, "engine error: exploded",
                           metadata={delivery.DELIVERED: str(delivered)})
    status = failure.to_status()
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(), grpc.aio.Metadata(*status.trailing_metadata),
                                status.details)


async def test_a_final_that_overtakes_its_deltas_waits_for_them() -> None:
    """The Final (on the call) can arrive before the last deltas (on the delivery stream)."""
    queue: asyncio.Queue = asyncio.Queue()
    call = DeliveredCall(ScriptedCall(pb.InferEvent(final=pb.Final(delivered=2)), grpc.aio.EOF),  # type: ignore[arg-type]
                         DeliveryReader(None), 1, queue)
    reading = asyncio.ensure_future(call.read())
    await until(lambda: call._call_ended, "the call's Final and end read")
    assert not reading.done()  # the Final counts 2 deltas, none read yet
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(text="a")))
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(text="b")))
    got = [await reading, await call.read(), await call.read(), await call.read()]
    assert [g.delta.text for g in got[:2]] == ["a", "b"]
    assert got[2].final.delivered == 2 and got[3] is grpc.aio.EOF


async def test_an_error_that_overtakes_its_deltas_waits_for_them() -> None:
    """An error the worker raised after sending deltas (an engine failure mid-generation) comes on
    the call, which is not ordered with the delivery stream: the deltas sent before it are read first."""
    queue: asyncio.Queue = asyncio.Queue()
    call = DeliveredCall(ScriptedCall(worker_error(delivered=2)), DeliveryReader(None), 1, queue)  # type: ignore[arg-type]
    reading = asyncio.ensure_future(call.read())
    await until(lambda: queue.empty() and call._held is not None, "the call's error read")
    assert not reading.done()
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(text="a")))
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(text="b")))
    assert [(await reading).delta.text, (await call.read()).delta.text] == ["a", "b"]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call.read()
    assert e.value.code() == grpc.StatusCode.INTERNAL


async def test_a_held_error_whose_deltas_cannot_come_fails_with_its_own_cause() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    call = DeliveredCall(ScriptedCall(worker_error(delivered=2)), DeliveryReader(None), 1, queue)  # type: ignore[arg-type]
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(text="a")))
    assert (await call.read()).delta.text == "a"
    await until(lambda: not queue.empty(), "the call's error arrived")  # it counts 2 deltas, 1 read
    queue.put_nowait(delivery.StreamEnded("reset", broken=True))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(call.read(), 5)
    assert e.value.code() == grpc.StatusCode.INTERNAL  # the engine's failure, not the stream's


async def test_a_call_whose_stream_broke_fails_with_its_own_error_once_it_has_one() -> None:
    """The delivery stream, which was sending, learns of a broken connection before the call does.
    The call's failure waits for the call's own end: a call made again at once on the same replica
    would otherwise go out on the dead connection, before the channel dropped it."""
    gone = asyncio.Event()
    own = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "Socket closed")
    queue: asyncio.Queue = asyncio.Queue()
    call = DeliveredCall(ScriptedCall(gone, own), DeliveryReader(None), 1, queue)  # type: ignore[arg-type]
    queue.put_nowait(delivery.StreamEnded("reset", broken=True))
    reading = asyncio.ensure_future(call.read())
    await until(lambda: queue.empty(), "the stream's end read")
    await asyncio.sleep(0.05)
    assert not reading.done()  # waits for the call's own end
    gone.set()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await reading
    assert e.value.details() == "Socket closed"


async def test_a_call_whose_stream_broke_fails_after_a_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery, "CALL_END_WAIT_S", 0.05)
    queue: asyncio.Queue = asyncio.Queue()
    call = DeliveredCall(ScriptedCall(asyncio.Event()), DeliveryReader(None), 1, queue)  # type: ignore[arg-type]
    queue.put_nowait(delivery.StreamEnded("reset", broken=True))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(call.read(), 5)  # the call itself never ends
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "delivery stream ended" in e.value.details()
    call.cancel()


@pytest.mark.parametrize("ended", [asyncio.CancelledError(), grpc.aio.UsageError("closed")])
async def test_a_call_ended_here_reaches_its_reader(ended: BaseException) -> None:
    """grpc.aio ends a call whose channel closes with CancelledError from `read()` (UsageError with
    interceptors). Its reader must learn it, never wait for it: after the Final that is the end,
    before it an error."""
    whole = DeliveredCall(ScriptedCall(pb.InferEvent(final=pb.Final()), ended),  # type: ignore[arg-type]
                          DeliveryReader(None), 1, asyncio.Queue())
    assert (await whole.read()).HasField("final")
    assert await asyncio.wait_for(whole.read(), 5) is grpc.aio.EOF
    cut = DeliveredCall(ScriptedCall(ended), DeliveryReader(None), 2, asyncio.Queue())  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(cut.read(), 5)
    assert e.value.code() == grpc.StatusCode.CANCELLED


async def test_streams_that_break_give_each_call_an_error_of_its_own() -> None:
    ended = delivery.StreamEnded("reset", broken=True)
    assert ended.error() is not ended.error()  # one shared object would collect every call's traceback
