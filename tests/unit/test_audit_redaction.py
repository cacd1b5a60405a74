"""The audit trail with contents (`MSHIP_AUDIT_CONTENT=1`) never records what a request hands to a
tool server as credentials (issue #16: header values are never logged)."""

from __future__ import annotations

import json

from services.gateway.edge.audit import CONTENT_LIMIT, REDACTED, request_text


def test_mcp_headers_and_authorization_are_redacted_and_the_rest_kept() -> None:
    body = {"model": "m", "input": "hi", "tools": [
        {"type": "mcp", "server_label": "w", "server_url": "http://x/mcp",
         "headers": {"Authorization": "Bearer s3cret", "x-key": "k3y"}, "authorization": "tok3n"},
        {"type": "function", "name": "f", "parameters": {}}]}
    recorded = request_text([json.dumps(body).encode()])
    assert all(secret not in recorded for secret in ("s3cret", "k3y", "tok3n"))
    tools = json.loads(recorded)["tools"]
    assert tools[0]["headers"] == {"Authorization": REDACTED, "x-key": REDACTED}
    assert tools[0]["authorization"] == REDACTED and tools[1] == body["tools"][1]
    assert json.loads(recorded)["input"] == "hi"


def test_other_bodies_are_recorded_as_sent_up_to_the_limit() -> None:
    chat = b'{"model": "m",  "messages": [{"role": "user", "content": "say hi"}]}'
    assert request_text([chat[:20], chat[20:]]) == chat.decode()  # byte for byte: nothing parsed and redumped
    assert request_text([b"not json"]) == "not json"
    assert len(request_text([b"x" * (CONTENT_LIMIT + 10)])) == CONTENT_LIMIT
