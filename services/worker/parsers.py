"""Streaming output parsers: `<think>` reasoning and Hermes-style `<tool_call>` blocks.

Engine-neutral (vLLM and llama.cpp feed the same detokenized text). Text that may be the start of
a tag is held back until the next delta decides it, so no client ever sees half a tag.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Protocol

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ParsedToolCall:
    index: int
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Parsed:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.text or self.reasoning or self.tool_calls)


class ChoiceParser(Protocol):
    """What the servicer feeds a choice's text through: `StreamParser`, or the tool_choice parsers
    (services/worker/tool_choice.py) that read a constrained generation as tool calls."""

    tool_calls: int  # calls found so far
    in_reasoning: bool
    calls_finish: bool  # a "stop" with tool calls is reported as FINISH_REASON_TOOL_CALLS

    def feed(self, delta: str) -> Parsed: ...

    def finish(self) -> Parsed: ...


def opens_reasoning(prompt_tail: str) -> bool:
    """Whether a rendered prompt ending in `prompt_tail` leaves a `<think>` block open: the chat
    template opened it (Qwen3 thinking, DeepSeek-R1-0528), so the output holds only `</think>`."""
    return prompt_tail.rstrip().endswith(THINK_OPEN)


def parse_call(body: str, index: int) -> ParsedToolCall | None:
    """A `{"name": ..., "arguments" | "parameters": {...}}` object as call `index`; None if it is not one."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ParsedToolCall(index=index, id=new_call_id(), name=obj["name"], arguments=args_text)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held_prefix(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(buf)), 0, -1):
            if buf.endswith(tag[:n]):
                best = max(best, n)
                break
    return best


class StreamParser:
    """Split a choice's text deltas into content, reasoning and complete tool calls. `opened`: the
    prompt left a `<think>` block open (`opens_reasoning`), so the output starts as reasoning."""

    calls_finish = True

    def __init__(self, *, reasoning: bool, tools: bool, opened: bool = False) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._buf = ""
        self._state = "start" if reasoning else "content"  # start | think | content | tool
        self._tool_text = ""
        self.tool_calls = 0
        self.in_reasoning = False
        self._after_think = False
        if reasoning and opened:
            self._state, self.in_reasoning = "think", True

    def feed(self, delta: str) -> Parsed:
        self._buf += delta
        out = Parsed()
        while self._step(out):
            pass
        return out

    def finish(self) -> Parsed:
        """Flush what is held back; an unterminated tool call is returned as text."""
        out = Parsed()
        rest, self._buf = self._buf, ""
        if self._state == "think":
            out.reasoning += rest
        elif self._state == "tool":
            out.text += TOOL_OPEN + self._tool_text + rest
        elif rest.strip() or not self.tool_calls:
            out.text += rest
        self._state = "content"
        self.in_reasoning = False
        return out

    def _step(self, out: Parsed) -> bool:
        buf = self._buf
        if self._state == "start":
            stripped = buf.lstrip()
            if stripped.startswith(THINK_OPEN):
                self._buf = stripped[len(THINK_OPEN):]
                self._state, self.in_reasoning = "think", True
                return True
            if THINK_OPEN.startswith(stripped):  # still undecided (also for "")
                return False
            self._state = "content"
            return True
        if self._state == "think":
            pos = buf.find(THINK_CLOSE)
            if pos < 0:
                keep = _held_prefix(buf, (THINK_CLOSE,))
                out.reasoning += buf[: len(buf) - keep]
                self._buf = buf[len(buf) - keep:]
                return False
            out.reasoning += buf[:pos]
            self._buf = buf[pos + len(THINK_CLOSE):]
            self._state, self.in_reasoning, self._after_think = "content", False, True
            return True
        if self._state == "content":
            if self._after_think:  # the newline after </think> is formatting
                buf = self._buf = buf.lstrip("\n")
                if not buf:
                    return False
                self._after_think = False
            pos = buf.find(TOOL_OPEN) if self._tools else -1
            if pos < 0:
                keep = _held_prefix(buf, (TOOL_OPEN,)) if self._tools else 0
                if self.tool_calls and not buf[: len(buf) - keep].strip():
                    keep = len(buf)  # whitespace after a call: formatting unless text follows
                out.text += buf[: len(buf) - keep]
                self._buf = buf[len(buf) - keep:]
                return False
            text = buf[:pos]
            # whitespace between or before tool calls is formatting, not content
            out.text += text if text.strip() or not (self.tool_calls or out.tool_calls) else ""
            self._buf, self._state, self._tool_text = buf[pos + len(TOOL_OPEN):], "tool", ""
            return True
        # tool
        pos = buf.find(TOOL_CLOSE)
        if pos < 0:
            self._tool_text += buf
            self._buf = ""
            keep = _held_prefix(self._tool_text, (TOOL_CLOSE,))
            if keep:
                self._tool_text, self._buf = self._tool_text[:-keep], self._tool_text[-keep:]
            return False
        body = self._tool_text + buf[:pos]
        self._buf, self._state = buf[pos + len(TOOL_CLOSE):], "content"
        call = self._parse_call(body)
        if call is None:
            out.text += TOOL_OPEN + body + TOOL_CLOSE
        else:
            out.tool_calls.append(call)
        return True

    def _parse_call(self, body: str) -> ParsedToolCall | None:
        call = parse_call(body, self.tool_calls)
        if call is not None:
            self.tool_calls += 1
        return call
