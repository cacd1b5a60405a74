"""The prefix-affinity key of an Infer call: which calls share a prompt prefix.

Prefix caches are per identity (the edge salts them with `cache_salt`), and a prompt's reusable
head is what its conversations have in common: the leading system/developer messages (a shared
system prompt), else the first message (the root of a `previous_response_id` chain or of a
multi-turn chat, which every later turn repeats), or the head of a raw prompt. Only that head is
hashed, so the key costs the same whatever the conversation's length.
"""

from __future__ import annotations

import hashlib
from itertools import takewhile

from mship.worker.v1 import worker_pb2 as pb

PREFIX_CHARS = 4096  # of the leading text: enough to tell system prompts apart, bounded per call
_LEADING_ROLES = ("system", "developer")


def prefix_key(request: pb.InferRequest) -> str | None:
    """A digest of `cache_salt` + model + the prompt's leading text (short, so a picker hashes it
    cheaply once per endpoint); None when there is no text to share."""
    head = _leading_text(request)[:PREFIX_CHARS]
    if not head:
        return None
    text = f"{request.cache_salt}\0{request.model}\0{head}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _leading_text(request: pb.InferRequest) -> str:
    if request.WhichOneof("input") == "prompt":
        prompt = request.prompt
        return prompt.text or ",".join(map(str, prompt.token_ids[:PREFIX_CHARS // 4]))
    messages = request.chat.messages
    leading = list(takewhile(lambda m: m.role in _LEADING_ROLES, messages)) or list(messages[:1])
    return "\0".join(_text(m) for m in leading)


def _text(message: pb.ChatMessage) -> str:
    if message.WhichOneof("body") == "parts":
        return "".join(part.text for part in message.parts.parts)
    return message.content
