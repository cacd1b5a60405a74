"""The floor of a multiplexed token path (`bench/gateway_cpu.py --floor`): what a Python edge would
spend per token if one gRPC stream per worker carried every request's deltas, one message per
engine step, instead of one Infer stream per request. Both ends are bench toys on a bench-only
wire format (no proto change): a worker that steps all its streams on one clock and sends each
step's deltas in one message, and an edge, like bench/edge_floor.py, that writes each delta
straight to its client's transport from the one reader of that stream (no task per request).

Wire format, raw bytes over a bidi stream `/bench.Mux/Stream`:
  edge -> worker, one message per request:  !IH   stream id, max tokens
  worker -> edge, one message per step:     (!IBH stream id, last, text length; text) per stream
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import AsyncIterator

import grpc

from bench.edge_floor import HEAD, RequestsProtocol, chunk, sse
from services.common.routes import CHANNEL_OPTIONS

METHOD = "/bench.Mux/Stream"
OPEN, FRAME = struct.Struct("!IH"), struct.Struct("!IBH")
TEXT = b" tok"


async def serve_worker(port: int, step_s: float) -> grpc.aio.Server:
    """The multiplexing worker: every step, one message with a token of each open stream."""

    async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        remaining: dict[int, int] = {}
        opened = asyncio.Event()

        async def read() -> None:
            async for message in requests:
                sid, tokens = OPEN.unpack(message)
                remaining[sid] = tokens
                opened.set()

        reader = asyncio.ensure_future(read())
        try:
            while True:
                await opened.wait()
                await asyncio.sleep(step_s)
                frames = []
                for sid, left in list(remaining.items()):
                    last = left <= 1
                    frames.append(FRAME.pack(sid, last, len(TEXT)) + TEXT)
                    if last:
                        del remaining[sid]
                    else:
                        remaining[sid] = left - 1
                if not remaining:
                    opened.clear()
                yield b"".join(frames)
        finally:
            reader.cancel()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "bench.Mux", {"Stream": grpc.stream_stream_rpc_method_handler(stream)})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


class MuxEdge(RequestsProtocol):
    """Each request's deltas arrive through `MuxReader`, which writes them to this connection."""

    def __init__(self, mux: MuxReader) -> None:
        super().__init__()
        self.mux = mux

    def request(self, body: dict) -> None:
        assert self.transport is not None
        self.transport.write(HEAD)
        self.mux.open(self.transport, body["max_tokens"])


class MuxReader:
    """The one stream to the worker: requests go out on it, each step's deltas come back on it."""

    def __init__(self, worker: str) -> None:
        self.channel = grpc.aio.insecure_channel(worker, options=CHANNEL_OPTIONS)
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.streams: dict[int, tuple[asyncio.Transport, str]] = {}
        self.ids = itertools.count()

    def open(self, transport: asyncio.Transport, max_tokens: int) -> None:
        sid = next(self.ids)
        self.streams[sid] = (transport, f"chatcmpl-{sid}")
        self.outbox.put_nowait(OPEN.pack(sid, max_tokens))

    async def _requests(self) -> AsyncIterator[bytes]:
        while True:
            yield await self.outbox.get()

    async def run(self) -> None:
        call = self.channel.stream_stream(METHOD)(self._requests())
        streams, size, write = self.streams, FRAME.size, self.write
        async for message in call:
            at = 0
            while at < len(message):
                sid, last, n = FRAME.unpack_from(message, at)
                text = message[at + size:at + size + n]
                at += size + n
                transport, rid = streams[sid]
                if last:
                    del streams[sid]
                write(transport, rid, last, text)

    @staticmethod
    def write(transport: asyncio.Transport, rid: str, last: bool, text: bytes) -> None:
        """One frame to its client: the delta, and after the last the end of the stream."""
        if last:
            transport.write(sse(rid, text.decode()) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        else:
            transport.write(sse(rid, text.decode()))


async def serve_edge(worker: str, reader: type[MuxReader] = MuxReader) -> None:
    mux = reader(worker)
    reader = asyncio.ensure_future(mux.run())
    server = await asyncio.get_running_loop().create_server(lambda: MuxEdge(mux), "127.0.0.1", 0)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.gather(server.serve_forever(), reader)
