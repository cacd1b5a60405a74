"""Compaction (`/v1/responses/compact`): the conversation's summary sealed into an opaque item.

`CompactionCodec` seals a summary into a compaction item's `encrypted_content` (AES-GCM), so a
client can carry it into a new chain but neither read nor forge it. The key comes from
MSHIP_COMPACTION_KEY (base64 of 32 bytes), shared by every gateway replica.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from services.common.vocabulary import ENV_COMPACTION_KEY
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.protocol_events import new_item_id
from services.gateway.responses.protocol_items import CompactionItem

SUMMARY_PROMPT = "Summarize the conversation so far in a few sentences, keeping every fact needed to continue it."
SUMMARY_MAX_TOKENS = 256


class CompactionCodec:
    def __init__(self, key_b64: str | None = None) -> None:
        raw = key_b64 or os.environ.get(ENV_COMPACTION_KEY)
        self._aead = AESGCM(base64.b64decode(raw)) if raw else AESGCM(AESGCM.generate_key(bit_length=256))

    @staticmethod
    def new_key() -> str:
        return base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()

    def seal(self, items: list[dict[str, Any]]) -> str:
        nonce = os.urandom(12)
        return base64.b64encode(nonce + self._aead.encrypt(nonce, json.dumps(items).encode(), b"mship")).decode()

    def open(self, content: str) -> list[dict[str, Any]]:
        try:
            raw = base64.b64decode(content, validate=True)
            return json.loads(self._aead.decrypt(raw[:12], raw[12:], b"mship"))
        except Exception as e:  # tampered, truncated, or sealed under another key
            raise OpenAIError(400, "The compaction item is invalid or was produced by another deployment.",
                              param="input", code="invalid_compaction") from e

    def expand(self, items: Sequence[Any]) -> list[Any]:
        """Input items with each compaction item replaced by the items it sealed."""
        out: list[Any] = []
        for item in items:
            out.extend(self.open(item.encrypted_content) if isinstance(item, CompactionItem) else [item])
        return out

    def compacted(self, conversation: list[dict[str, Any]], summary_response: dict[str, Any]) -> dict[str, Any]:
        """The `response.compaction` object: the user's messages kept verbatim, then a sealed
        compaction item carrying the summary the model wrote (`summary_response`'s text)."""
        summary = "".join(part.get("text", "") for item in summary_response["output"]
                          if item.get("type") == "message" for part in item.get("content", []))
        # every message item the spec returns has a status; input items may have come without one
        kept = [{**item, "status": item.get("status") or "completed"} for item in conversation
                if item.get("type") == "message" and item.get("role") == "user"]
        sealed = self.seal([{"type": "message", "role": "developer",
                             "content": f"Summary of the conversation so far: {summary}"}])
        return {"id": new_item_id("resp"), "object": "response.compaction", "created_at": int(time.time()),
                "usage": summary_response["usage"],
                "output": [*kept, {"type": "compaction", "id": new_item_id("cmp"), "encrypted_content": sealed}]}
