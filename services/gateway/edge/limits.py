"""Request body bound, enforced while reading (a Content-Length that lies does not get past it)."""

from __future__ import annotations

from services.gateway.edge.errors import send_error
from services.gateway.protocol_common.openai_error import body_too_large

DEFAULT_MAX_BODY_BYTES = 32 * 2**20


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Pure ASGI: 413 with an OpenAI error body when the request body exceeds `max_bytes`."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send)
        seen = 0

        async def bounded_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        try:
            await self.app(scope, bounded_receive, send)
        except BodyTooLarge:
            await self._reject(send)

    async def _reject(self, send) -> None:
        await send_error(send, body_too_large(self.max_bytes))
