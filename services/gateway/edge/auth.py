"""The edge's one authentication point (pure ASGI): every `/v1/` request and WebSocket is
authenticated here before any route runs; health and readiness stay open for probes.

The `Caller` goes to the routes in `scope["state"]["caller"]` (`identity.caller_of`); what the
request's serving adds to `caller.response_headers` (the rate-limit headers) goes out with the
response here, so no handler builds headers of its own.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection

from services.gateway.edge.errors import send_error
from services.gateway.identity import Authenticator
from services.gateway.protocol_common.openai_error import OpenAIError

PROTECTED_PREFIX = "/v1/"
POLICY_VIOLATION = 1008  # WebSocket close code for a refused handshake


class AuthMiddleware:
    def __init__(self, app, authenticator: Authenticator) -> None:
        self.app, self.authenticator = app, authenticator

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or not scope["path"].startswith(PROTECTED_PREFIX):
            return await self.app(scope, receive, send)
        try:
            caller = self.authenticator.authenticate(HTTPConnection(scope))
        except OpenAIError as e:
            return await self._refuse(scope, send, e)
        scope.setdefault("state", {})["caller"] = caller
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start" and caller.response_headers:
                extra = [(k.lower().encode(), v.encode()) for k, v in caller.response_headers.items()]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    async def _refuse(scope, send, error: OpenAIError) -> None:
        if scope["type"] == "websocket":  # before accept: the server answers the handshake with 403
            await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": error.code or ""})
            return
        await send_error(send, error, [(b"www-authenticate", b'Bearer realm="mship"')])
