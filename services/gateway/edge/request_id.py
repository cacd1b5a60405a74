"""Every HTTP answer's `x-request-id`: the client's (when it is a sane one) or a new one, set as
the request's id for everything that runs for it (its log lines, the gRPC calls it makes: their
metadata carries it to the worker and the state service, whose lines carry it too). Outermost, so
that even a refused or malformed request has one."""

from __future__ import annotations

import logging
import time
import uuid

from services.common.logs import REQUEST_ID_METADATA, clean_request_id, request_id

log = logging.getLogger("services.gateway.access")
_HEADER = REQUEST_ID_METADATA.encode()


class RequestIdMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope.get("headers") or () if k == _HEADER), None)
        rid = clean_request_id(given) or uuid.uuid4().hex
        token = request_id.set(rid)
        header = (_HEADER, rid.encode())
        t0, status = time.monotonic(), [0]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if log.isEnabledFor(logging.DEBUG):  # the access log: MSHIP_LOG_LEVEL=DEBUG
                log.debug("%s %s -> %d in %.1f ms", scope["method"], scope["path"], status[0],
                          (time.monotonic() - t0) * 1000)
            request_id.reset(token)
