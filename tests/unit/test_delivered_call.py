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


def deltas(texts: list[str], index: int = 0) -> list[pb.InferEvent]:
    return [pb.InferEvent(delta=pb.Delta(index=index, text=t, token_count=1,
                                         logprobs=[pb.TokenLogprob(token=t, logprob=-1.0)])) for t in texts]


async def read_to_end(call: DeliveredCall) -> tuple[dict[int, str], int, pb.Final | None]:
    texts: dict[int, str] = {}
    logprobs, final = 0, None
    while (event := await asyncio.wait_for(call.read(), 5)) is not grpc.aio.EOF:
        if event.HasField("final"):
            final = event.final
        else:
            texts[event.delta.index] = texts.get(event.delta.index, "") + event.delta.text
            logprobs += len(event.delta.logprobs)
    return texts, logprobs, final


async def test_what_a_reader_that_stopped_reading_holds_grows_with_the_text_not_per_token() -> None:
    """A client that stops reading: its call's deltas keep coming on the shared stream (no flow
    control per call there). Past COALESCE_AFTER waiting, each is merged into its choice's last, so
    the call holds a few events, not one per token; read later, nothing is lost or reordered and the
    Final's count of deltas still matches. Choices (n > 1) interleave and stay apart."""
    n = 5000
    queue = delivery.CallEvents()
    call = DeliveredCall(ScriptedCall(asyncio.Event()), DeliveryReader(None), 1, queue)  # type: ignore[arg-type]
    for a, b in zip(deltas([f"a{i} " for i in range(n)]), deltas([f"b{i} " for i in range(n)], index=1), strict=True):
        queue.put_nowait(a)
        queue.put_nowait(b)
    assert queue.qsize() <= delivery.COALESCE_AFTER + 2, queue.qsize()  # ~64, where it was 10,000
    queue.put_nowait(pb.InferEvent(final=pb.Final(delivered=2 * n)))
    queue.put_nowait(delivery._CALL_ENDED)
    texts, logprobs, final = await read_to_end(call)
    assert texts == {0: "".join(f"a{i} " for i in range(n)), 1: "".join(f"b{i} " for i in range(n))}
    assert logprobs == 2 * n and final is not None and final.delivered == 2 * n


def test_only_deltas_whose_merge_keeps_their_meaning_are_merged() -> None:
    queue = delivery.CallEvents()
    for event in deltas(["x"] * delivery.COALESCE_AFTER):
        queue.put_nowait(event)
    call = pb.InferEvent(delta=pb.Delta(tool_calls=[pb.ToolCallDelta(index=0, name="f", arguments="{")]))
    thinking = pb.InferEvent(delta=pb.Delta(reasoning="hm"))
    queue.put_nowait(call)  # tool-call fragments are never merged (their own index and order)
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(text="after")))  # nor merged into a tool call
    queue.put_nowait(thinking)  # reasoning after text is not (the order would change)
    queue.put_nowait(pb.InferEvent(delta=pb.Delta(reasoning=" more")))  # reasoning after reasoning is
    assert queue.qsize() == delivery.COALESCE_AFTER + 3
    assert thinking.delta.reasoning == "hm more"


async def test_a_final_that_comes_just_after_its_stream_broke_still_completes_the_call() -> None:
    """Every delta read, then the delivery stream breaks just before the call's Final arrives: the
    answer is whole (the Final counts what was read), not UNAVAILABLE."""
    final_sent = asyncio.Event()
    queue = delivery.CallEvents()
    call = DeliveredCall(ScriptedCall(final_sent, pb.InferEvent(final=pb.Final(delivered=2)), grpc.aio.EOF),  # type: ignore[arg-type]
                         DeliveryReader(None), 1, queue)
    for event in deltas(["a", "b"]):
        queue.put_nowait(event)
    queue.put_nowait(delivery.StreamEnded("reset", broken=True))
    assert [(await call.read()).delta.text, (await call.read()).delta.text] == ["a", "b"]
    reading = asyncio.ensure_future(call.read())
    await asyncio.sleep(0.02)
    final_sent.set()
    assert (await asyncio.wait_for(reading, 5)).final.delivered == 2
    assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF


async def test_an_error_after_the_final_does_not_replace_it() -> None:
    """The Final came (before its deltas), then the call ended with an error (a deadline between the
    Final and the trailers): the deltas and the Final are what the reader gets."""
    late = grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "late")
    queue = delivery.CallEvents()
    call = DeliveredCall(ScriptedCall(pb.InferEvent(final=pb.Final(delivered=1)), late),  # type: ignore[arg-type]
                         DeliveryReader(None), 1, queue)
    reading = asyncio.ensure_future(call.read())
    await until(lambda: call._follower.done(), "the call's Final and error")
    queue.put_nowait(deltas(["a"])[0])
    assert (await asyncio.wait_for(reading, 5)).delta.text == "a"
    assert (await asyncio.wait_for(call.read(), 5)).final.delivered == 1


async def test_a_call_that_carries_its_own_deltas_outlives_the_stream_breaking() -> None:
    """A worker that does not know the stream sends the call's deltas on the call: the stream
    breaking loses nothing of it."""
    more = asyncio.Event()
    queue = delivery.CallEvents()
    call = DeliveredCall(ScriptedCall(*deltas(["a"]), more, *deltas(["b"]), pb.InferEvent(final=pb.Final()),  # type: ignore[arg-type]
                                      grpc.aio.EOF), DeliveryReader(None), 1, queue)
    assert (await asyncio.wait_for(call.read(), 5)).delta.text == "a"
    queue.put_nowait(delivery.StreamEnded("reset", broken=True))
    more.set()
    texts, _, final = await read_to_end(call)
    assert texts == {0: "b"} and final is not None


async def test_cancel_wakes_a_read_waiting_in_another_task() -> None:
    call = DeliveredCall(ScriptedCall(asyncio.Event()), DeliveryReader(None), 1, delivery.CallEvents())  # type: ignore[arg-type]
    reading = asyncio.ensure_future(call.read())
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(reading, 5)
