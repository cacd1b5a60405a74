"""Serving shared by chat and completions: one worker call per request, answered as one JSON
object or streamed as chunks. HTTP-free, like every endpoint's serving: the router watches the
client (`guard`) and builds the HTTP response."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError
from services.common.routes import RouteTable
from services.gateway.admission.admission import Admission
from services.gateway.edge.answer import Guard, unguarded
from services.gateway.edge.sse import SSE_DONE, sse_event
from services.gateway.generation import Generation, check_routed, open_generation
from services.gateway.identity import Caller, cache_salt_for
from services.gateway.protocol_common.openai_error import OpenAIError


class Assembler(Protocol):
    id: str

    def add(self, event: pb.InferEvent) -> None: ...
    def result(self) -> dict[str, Any]: ...


class StreamEncoder(Protocol):
    id: str

    def encode(self, event: pb.InferEvent) -> list[dict[str, Any]]: ...


@dataclass
class GenerationCall:
    """What an endpoint's parsed request needs from the shared serving: its worker request and
    how to build the response."""

    model: str
    stream: bool
    to_infer: Callable[[str, str | None], pb.InferRequest]  # (request id, cache salt) -> worker request
    assembler: Callable[[], Assembler]
    encoder: Callable[[], StreamEncoder]
    input_param: str = "messages"

    @classmethod
    def of(cls, req: Any, to_infer: Callable[..., pb.InferRequest], assembler: Any, encoder: Any,
           input_param: str = "messages") -> GenerationCall:
        """The call for a parsed `req`, its `to_infer_request`, and its assembler / encoder classes."""
        return cls(req.model, bool(req.stream),
                   lambda request_id, salt: to_infer(req, request_id=request_id, cache_salt=salt),
                   lambda: assembler.for_request(req), lambda: encoder.for_request(req), input_param)


class ChunkStream:
    """A generation streamed as `data:` chunks, then `[DONE]`; `release()` cancels its worker call."""

    def __init__(self, generation: Generation, encoder: StreamEncoder) -> None:
        self.generation, self.encoder = generation, encoder

    async def frames(self) -> AsyncIterator[bytes]:
        """One write per worker event: the chunks an event makes (a choice's opening and its text)
        go out together, the last ones (finish, usage) with `[DONE]`."""
        end = b""
        try:
            async for event in self.generation:
                data = b"".join(sse_event(chunk) for chunk in self.encoder.encode(event))
                if event.HasField("final"):
                    end = data
                elif data:
                    yield data
        except UpstreamError as e:  # after the first token: the error travels in the stream
            end += sse_event(self.generation.failure(e).body())
        except OpenAIError as e:
            end += sse_event(e.body())
        finally:
            self.release()
        yield end + SSE_DONE

    def release(self) -> None:
        self.generation.close()


class GenerationServing:
    """An endpoint served by one worker call: subclasses turn the body into its `GenerationCall`."""

    def __init__(self, table: RouteTable, timeout_s: float | None = None, admission: Admission | None = None) -> None:
        self.table, self.timeout_s = table, timeout_s
        self.admission = admission or Admission(table)

    def call(self, body: bytes) -> GenerationCall:
        raise NotImplementedError

    async def create(self, body: bytes, caller: Caller, guard: Guard = unguarded) -> dict[str, Any] | ChunkStream:
        call = self.call(body)
        check_routed(self.table, call.model)
        salt = cache_salt_for(caller.identity)
        if call.stream:
            encoder = call.encoder()
            opening = self._open(call, call.to_infer(encoder.id, salt), caller, len(body))
            return ChunkStream(await guard(opening), encoder)
        assembler = call.assembler()
        return await guard(_assemble(self._open(call, call.to_infer(assembler.id, salt), caller, len(body)), assembler))

    async def _open(self, call: GenerationCall, infer: pb.InferRequest, caller: Caller, size: int) -> Generation:
        ticket = await self.admission.admit_generation(caller, call.model, size, infer)
        return await open_generation(self.table, call.model, infer, input_param=call.input_param,
                                     timeout_s=self.timeout_s, ticket=ticket, identity=caller.identity)


async def _assemble(opening: Awaitable[Generation], assembler: Assembler) -> dict[str, Any]:
    generation = await opening
    try:
        async for event in generation:
            assembler.add(event)
    except UpstreamError as e:
        raise generation.failure(e) from e
    finally:
        generation.close()
    return assembler.result()
