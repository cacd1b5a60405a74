"""The least a separate Python edge process can spend per streamed token under the platform's
contract (one worker Infer stream per request, read with grpc.aio): an HTTP/1.1 server on a bare
asyncio protocol, on uvloop, that reads a request, opens the Infer stream and writes each event as
one pre-formatted SSE chunk in one transport write. No validation, no middleware, no routing, no
JSON encoding but the delta's text and the final usage: a floor to hold the real gateway against
(`bench/gateway_cpu.py --floor` in front of a worker double, `bench/edge_overhead.py --floor` in
front of the platform's worker replica), not a server to use.

  .venv/bin/python bench/edge_floor.py HOST:PORT   (the worker; prints the edge's URL)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys

import grpc
import uvloop

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.routes import CHANNEL_OPTIONS

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n")
ids = itertools.count()


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def sse(rid: str, text: str) -> bytes:
    # As the gateway's chunk reads, minus the fields the bench does not look at.
    return chunk(b'data: {"id":"%s","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
                 b'{"content":%s}}]}\n\n' % (rid.encode(), json.dumps(text).encode()))


class RequestsProtocol(asyncio.Protocol):
    """One client connection: its requests one after the other (keep-alive), each handed to
    `request(body)` once whole (the JSON body; enough HTTP for the bench's client)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if sep and len(rest) >= length:
            self.buffer = rest[length:]
            self.request(json.loads(rest[:length]))

    def request(self, body: dict) -> None:
        raise NotImplementedError


class FloorEdge(RequestsProtocol):
    """Each request streamed from the worker on an Infer call of its own."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub) -> None:
        super().__init__()
        self.stub, self.task = stub, None

    def request(self, body: dict) -> None:
        self.task = asyncio.ensure_future(self.answer(body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()  # the client hung up: the Infer call goes with the task

    async def answer(self, body: dict) -> None:
        assert self.transport is not None
        rid = f"chatcmpl-{next(ids)}"
        request = pb.InferRequest(request_id=rid, model=body["model"], sampling=pb.SamplingParams(
            max_tokens=body["max_tokens"], ignore_eos=body.get("ignore_eos", False),
            temperature=body.get("temperature")), chat=pb.ChatInput(messages=[
                pb.ChatMessage(role=m["role"], content=m["content"]) for m in body["messages"]]))
        write = self.transport.write
        write(HEAD)
        async for event in self.stub.Infer(request):
            if event.HasField("delta"):
                write(sse(rid, event.delta.text))
            elif event.HasField("final"):  # the usage chunk, as with stream_options.include_usage
                write(chunk(b'data: {"id":"%s","choices":[],"usage":{"completion_tokens":%d}}\n\n'
                            % (rid.encode(), event.final.usage.completion_tokens)))
        write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def serve(worker: str) -> None:
    channel = grpc.aio.insecure_channel(worker, options=CHANNEL_OPTIONS)
    stub = worker_pb2_grpc.WorkerStub(channel)
    server = await asyncio.get_running_loop().create_server(lambda: FloorEdge(stub), "127.0.0.1", 0)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1]))
