"""A background response on a worker whose handlers are backed up on HTTP/2 flow control (#13).

Twelve direct Infer streams that nobody reads fill the worker: two hold the engine's two slots, ten
queue, and (no BDP probing on their channel, so every stream window stays at 64 KiB; top-20 logprobs
make each event ~0.5 KB) their handlers block on flow control. A background response must still
reach the worker at once and wait in the engine's queue like any other request.

The earlier "never arrived within 20 s" was its body: `max_output_tokens` below 16 is refused with
a 400 before any engine work (OpenAI's own minimum), so nothing was ever sent to the worker.
"""

from __future__ import annotations

import grpc
import httpx
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from tests.integration.test_platform import worker_address
from tests.worker_calls import chat, wait_load

pytestmark = pytest.mark.integration
UNREAD = 12
ARRIVAL_S = 5.0  # measured: ~0.05 s; the same bound a chat through the gateway meets


async def test_background_response_reaches_a_worker_full_of_unread_streams(platform):
    long = pb.SamplingParams(max_tokens=1000, ignore_eos=True, temperature=0.0, logprobs=True, top_logprobs=20)
    body = {"model": "tiny", "input": "Say hi.", "background": True, "temperature": 0}
    async with grpc.aio.insecure_channel(worker_address(platform), options=[("grpc.http2.bdp_probe", 0)]) as channel, \
            httpx.AsyncClient(base_url=f"{platform.base_url}/v1", headers=platform.headers, timeout=30) as http:
        stub = worker_pb2_grpc.WorkerStub(channel)
        blockers = [stub.Infer(chat("Hi", sampling=long)) for _ in range(UNREAD)]  # never read
        response_id = None
        try:
            await wait_load(stub, lambda r: r.inflight_calls == UNREAD and r.running_requests == 2, 10.0)

            refused = await http.post("/responses", json={**body, "max_output_tokens": 8})
            assert refused.status_code == 400, refused.text  # the note's request: refused, never sent on
            assert refused.json()["error"]["param"] == "max_output_tokens"

            created = await http.post("/responses", json={**body, "max_output_tokens": 16})
            assert created.status_code == 200, created.text
            response_id = created.json()["id"]
            report, _ = await wait_load(stub, lambda r: r.inflight_calls == UNREAD + 1, ARRIVAL_S)
            assert report.waiting_requests >= 3  # in the engine's queue behind the blockers, as a chat would be
            assert (await http.get(f"/responses/{response_id}")).json()["status"] == "in_progress"
        finally:
            if response_id is not None:
                await http.post(f"/responses/{response_id}/cancel")
            for call in blockers:
                call.cancel()
        await wait_load(stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0, 5.0)
