"""The prefix-affinity key: calls that share a prompt head (per identity) share a key."""

from __future__ import annotations

from mship.worker.v1 import worker_pb2 as pb
from services.common.affinity import PREFIX_CHARS, prefix_key

SYSTEM = "You are the support bot of ACME. " * 30


def chat(*messages: tuple[str, str], salt: str = "alice", model: str = "m") -> pb.InferRequest:
    request = pb.InferRequest(model=model, cache_salt=salt)
    for role, content in messages:
        request.chat.messages.add(role=role, content=content)
    return request


def test_one_system_prompt_one_key_whatever_the_question():
    a = prefix_key(chat(("system", SYSTEM), ("user", "Where is my order?")))
    b = prefix_key(chat(("system", SYSTEM), ("user", "Cancel it."), ("assistant", "Done."), ("user", "Thanks")))
    assert a is not None and a == b


def test_keys_differ_by_identity_model_and_system_prompt():
    base = prefix_key(chat(("system", SYSTEM), ("user", "q")))
    assert base != prefix_key(chat(("system", SYSTEM), ("user", "q"), salt="bob"))  # caches are per identity
    assert base != prefix_key(chat(("system", SYSTEM), ("user", "q"), model="other"))
    assert base != prefix_key(chat(("system", "Another bot."), ("user", "q")))


def test_without_a_system_prompt_a_conversation_keeps_its_first_message():
    first = prefix_key(chat(("user", "Plan a trip to Rome.")))
    later = prefix_key(chat(("user", "Plan a trip to Rome."), ("assistant", "Day 1..."), ("user", "And day 2?")))
    assert first == later and first != prefix_key(chat(("user", "Plan a trip to Oslo.")))


def test_parts_raw_prompts_and_the_bound():
    parts = pb.InferRequest(model="m", cache_salt="s")
    parts.chat.messages.add(role="system").parts.parts.add(text=SYSTEM)
    assert prefix_key(parts) == prefix_key(chat(("system", SYSTEM), salt="s"))
    long_prompt, other_tail = ("x" * PREFIX_CHARS + tail for tail in ("x" * 100, "y"))
    assert prefix_key(pb.InferRequest(model="m", prompt=pb.PromptInput(text=long_prompt))) == prefix_key(
        pb.InferRequest(model="m", prompt=pb.PromptInput(text=other_tail)))  # only the head is hashed
    assert prefix_key(pb.InferRequest(model="m", prompt=pb.PromptInput(token_ids=[1, 2, 3]))) is not None
    assert prefix_key(pb.InferRequest(model="m")) is None
