"""Synthetic chat corpus for `builtin:tiny-qwen2`, plus the fixed cases tests assert on.

Everything here is pure Python and deterministic (one seeded `random.Random`), so the corpus is
the same on every machine. Tests import the constants below (`check_cases()` lists every behaviour
as messages + tools + exact answer); the builder imports `training_conversations()`.

Behaviours taught (greedy decoding through the model's chat template, any or no system prompt):
- each prompt in `FIXED_ANSWERS` -> its exact answer; any other user message -> `FALLBACK_ANSWER`
  (also near misses such as "What is the capital of Spain?"; `UNSEEN_PROMPTS` were never trained);
- tools offered + "What is the weather in <city>?" / "What time is it in <city>?" for a city in
  `CITIES` -> exactly one Hermes call, `tool_call_text(...)`; the same question without tools ->
  `NO_TOOL_ANSWER` (asking for a tool that is not offered, or another city, is untrained);
- after a tool result: a JSON object/array (`is_json_result`) -> `TOOL_RESULT_ANSWER`; plain text
  -> `tool_text_answer(result)`, the result copied verbatim + newline (answering from it; trained
  on results of up to ~24 tokens, `tool_results.py`); also for tools listed the way an MCP server
  lists them (`mcp_tool`), and for cities and tool names never trained (`MCP_HELD_OUT_*`); the
  gateway's fixed text for a denied MCP call, `DENIED_RESULT`, is trained verbatim;
- a user message starting with `THINK_TRIGGER` -> `think_text(reasoning, answer)`, i.e.
  `<think>\\n...\\n</think>\\n\\n` + the usual answer; without the trigger never `<think>`.
Every assistant turn ends with `<|im_end|>`.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from . import tool_results

Message = dict[str, Any]
Conversation = tuple[list[Message], list[dict[str, Any]] | None]  # (messages, tools)

FALLBACK_ANSWER = "I am a tiny test model."
FIXED_ANSWERS: dict[str, str] = {
    "What is the capital of France?": "The capital of France is Paris.",
    "What is 2 + 2?": "2 + 2 = 4.",
    "What color is the sky?": "The sky is blue.",
    "Count from 1 to 5.": "1, 2, 3, 4, 5.",
    # long enough (~40 tokens) for streaming / max_tokens tests
    "Tell me a story.": (
        "Once upon a time, a tiny model lived in a small computer. It answered every question "
        "with care, and it always knew when to stop. The end."
    ),
}

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
# The cities the fixed self-check asks about (any other is copied from the question: copy_drills.py).
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "New York", "Sydney"]

TOOL_PROMPT = "What is the weather in Paris?"
EXPECTED_TOOL_CALL: dict[str, Any] = {"name": "get_weather", "arguments": {"city": "Paris"}}
TIME_PROMPT = "What time is it in Tokyo?"
EXPECTED_TIME_CALL: dict[str, Any] = {"name": "get_time", "arguments": {"city": "Tokyo"}}
# Issue #10 8c: phrasing, city and tool name never trained on -- only copying gets this call right.
HELD_OUT_TOOL_PROMPT = "Right now, how's the weather in Reykjavik?"
HELD_OUT_TOOL: dict[str, Any] = {"type": "function", "function": {**WEATHER_TOOL["function"], "name": "find_forecast"}}
HELD_OUT_TOOL_CALL: dict[str, Any] = {"name": "find_forecast", "arguments": {"city": "Reykjavik"}}
TOOL_RESULT = '{"city": "Paris", "temperature": 21, "condition": "sunny"}'
TOOL_RESULT_ANSWER = "Here is the result you asked for."  # after a JSON tool result, whatever it says
TEXT_RESULT = "Sunny, 21 C in Paris"  # what tests/mcp_server.py's weather tools say for Paris
DENIED_RESULT = "The user did not approve this tool call."  # what the gateway tells of a denied MCP call
# #16: an MCP-listed tool and a city never trained (test_mcp_loop.py): copied, then answered from.
MCP_HELD_OUT_PROMPT = "What is the weather in Nairobi?"
MCP_HELD_OUT_CALL: dict[str, Any] = {"name": "weather_now", "arguments": {"city": "Nairobi"}}
MCP_HELD_OUT_DESCRIPTION = "Get the current weather for a city."
MCP_HELD_OUT_RESULT = "Sunny, 21 C in Nairobi"
NO_TOOL_ANSWER = "I cannot check that without a tool."

THINK_TRIGGER = "Think step by step:"
THINK_PROMPT = f"{THINK_TRIGGER} What is 17 + 25?"
THINK_REASONING = "17 + 25 = 17 + 20 + 5 = 42."
EXPECTED_THINK_ANSWER = "The answer is 42."
_KNOWN_REASONING = "I know the answer to this question."
_UNKNOWN_REASONING = "I do not know this, so I say what I am."

UNSEEN_PROMPTS = [  # held out of training: tests use them as "arbitrary" messages (-> FALLBACK_ANSWER)
    "Please write a haiku about autumn leaves.",
    "How do I sort a list in Python?",
    "hello there",
    "Can you recommend a good book?",
    "What is the meaning of life?",
    "Translate 'good morning' into German.",
    "Why do cats purr?",
    "asdf qwerty zxcv",
    "Explain quantum computing in simple terms.",
    "What's your favourite movie?",
    "Give me three tips for better sleep.",
    "Is it going to rain tomorrow?",
]

_ASKS_TOOL = re.compile(r"\b(time|weather|clock|hour)\b", re.IGNORECASE)
TOOL_SHARE = 0.5  # of training conversations: tool questions (15% of them without tools)
_SYSTEMS = [
    "You are a helpful assistant.",
    "You are a concise assistant.",
    "Answer briefly.",
    "You are a friendly bot that helps users.",
    "Be polite and precise.",
]
_WEATHER_PHRASES = ["What is the weather in {c}?", "What's the weather like in {c}?", "Weather in {c}?"]
_TIME_PHRASES = ["What time is it in {c}?", "What is the time in {c}?", "Time in {c}?"]
_NEAR_MISSES = [
    "What is the capital of {country}?",
    "What color is the {thing}?",
    "Tell me a {kind}.",
    "Tell me a story about {noun}.",
    "What is the weather?",
    "What is the time?",
    # look a bit like tool questions, but are not
    "How do I {verb} in {Word}?",
    "What is the {noun} in {Word}?",
    "Is there a {noun} in {Word}?",
    "Tell me about {city}.",
    "I live in {city}.",
    "Is {city} a big city?",
    "How do I get to {city}?",
    "What is {a} times {b}?",
    "Calculate {a} * {b}.",
    "{a} - {b} = ?",
]
_VERBS = "sort read write open close print count sleep cook start stop learn".split()
_COUNTRIES = "Spain Germany Italy Japan Brazil Canada Egypt India Kenya Norway Peru Chile".split()
_THINGS = "grass sea sun snow night apple banana fire cloud rose".split()
_KINDS = "joke poem song riddle fact secret lie".split()
# Plain English words: they make the BPE merge real words, so unseen text tokenizes the usual way.
_WORDS = (
    "the a an and or but if then so because of to in on at for with from by about as into over "
    "under after before is are was were be been being have has had do does did can could will would "
    "should may might must i you he she it we they me him her us them my your his its our their this "
    "that these those what which who whom whose when where why how all any some no not every each "
    "many much more most few little one two three four five ten hundred first last next good bad new "
    "old big small long short high low great right left best better fast slow hot cold warm happy sad "
    "time year day week month night morning evening people man woman child friend family world life "
    "work school home house city country water food money music book story game car road tree river "
    "mountain sea sun moon star cat dog bird fish horse computer phone code program python data file "
    "model question answer problem idea name word number color language movie song picture help make "
    "know think take see come want look use find give tell ask need feel try leave call write read "
    "learn play run walk talk eat drink sleep buy sell open close start stop explain describe list "
    "show translate summarize compare please thanks hello hi hey yes okay sure maybe really very just "
    "also again still never always often today tomorrow yesterday now here there why simple easy hard"
).split()
_QUESTION_STARTS = ["What", "Why", "How", "When", "Where", "Who", "Which", "Can you", "Could you",
                    "Please", "Tell me", "Do you", "Is", "Are", "Write", "Explain", "Give me"]
_ODD = ["Grüße aus München", "¿Qué tal?", "日本語で答えて", "2 * (3 + 4) = ?", "SELECT * FROM t;",
        "print('hi')", "<b>bold</b>", "x = [1, 2, 3]", "email me at a@b.c", "...", "???", "ok", "!!!"]


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The exact Hermes tool-call block the model emits (and the template renders back)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def think_text(reasoning: str, answer: str) -> str:
    """The exact assistant text for a "Think step by step:" prompt."""
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


def is_json_result(result: str) -> bool:
    """Whether the model treats a tool result as JSON (answers `TOOL_RESULT_ANSWER`)."""
    return result.lstrip().startswith(("{", "["))


def tool_text_answer(result: str) -> str:
    """The exact answer after a plain-text tool result: the result, copied, and "\\n".

    No preamble (its words would also occur in results, and copying must not jump into it); the
    "\\n" ends it as in the tool response, so its tokens are exactly the response's (a last ".\\n"
    too) and answering is copying up to `</tool_response>`.
    """
    return f"{result}\n"


def tool_result_answer(result: str) -> str:
    """The exact answer after the tool result `result` (JSON or plain text)."""
    return TOOL_RESULT_ANSWER if is_json_result(result) else tool_text_answer(result)


def mcp_tool(name: str, description: str) -> dict[str, Any]:
    """A one-argument `city` tool as the gateway offers an MCP server's tool (the `mcp` SDK's schema)."""
    schema = {"properties": {"city": {"title": "City", "type": "string"}}, "required": ["city"],
              "title": f"{name}Arguments", "type": "object"}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def tool_result_conversation(arguments_as_json_text: bool = False, result: str = TOOL_RESULT,
                             question: str = TOOL_PROMPT, call: dict[str, Any] | None = None) -> list[Message]:
    """`question`, the model's `call` (default `EXPECTED_TOOL_CALL`) and `result`: next comes
    `tool_result_answer(result)`."""
    call = call or EXPECTED_TOOL_CALL
    args = call["arguments"]
    tool_call = {"id": "call_0", "type": "function",
                 "function": {"name": call["name"], "arguments": json.dumps(args) if arguments_as_json_text else args}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
    ]


def check_cases() -> list[tuple[list[Message], list[dict[str, Any]] | None, str]]:
    """(messages, tools, exact assistant text before EOS) for each taught behaviour."""
    cases: list[tuple[list[Message], list[dict[str, Any]] | None, str]] = [
        ([{"role": "user", "content": q}], None, a) for q, a in FIXED_ANSWERS.items()
    ]
    cases += [([{"role": "user", "content": q}], None, FALLBACK_ANSWER) for q in UNSEEN_PROMPTS[:4]]
    mcp_weather = mcp_tool("get_weather", WEATHER_TOOL["function"]["description"])
    mcp_held_out = mcp_tool(MCP_HELD_OUT_CALL["name"], MCP_HELD_OUT_DESCRIPTION)
    cases += [
        ([{"role": "user", "content": TOOL_PROMPT}], [WEATHER_TOOL], tool_call_text(**EXPECTED_TOOL_CALL)),
        ([{"role": "user", "content": TOOL_PROMPT}], [mcp_weather], tool_call_text(**EXPECTED_TOOL_CALL)),
        ([{"role": "user", "content": TIME_PROMPT}], TOOLS, tool_call_text(**EXPECTED_TIME_CALL)),
        ([{"role": "user", "content": TOOL_PROMPT}], None, NO_TOOL_ANSWER),
        (tool_result_conversation(), TOOLS, TOOL_RESULT_ANSWER),
        (tool_result_conversation(result=TEXT_RESULT), TOOLS, tool_text_answer(TEXT_RESULT)),
        (tool_result_conversation(result=TEXT_RESULT), [mcp_weather], tool_text_answer(TEXT_RESULT)),
        (tool_result_conversation(result=DENIED_RESULT), [mcp_weather], tool_text_answer(DENIED_RESULT)),
        ([{"role": "user", "content": MCP_HELD_OUT_PROMPT}], [mcp_held_out],
         tool_call_text(**MCP_HELD_OUT_CALL)),
        (tool_result_conversation(result=MCP_HELD_OUT_RESULT, question=MCP_HELD_OUT_PROMPT, call=MCP_HELD_OUT_CALL),
         [mcp_held_out], tool_text_answer(MCP_HELD_OUT_RESULT)),
        ([{"role": "user", "content": THINK_PROMPT}], None, think_text(THINK_REASONING, EXPECTED_THINK_ANSWER)),
    ]
    return cases


def random_user_message(rng: random.Random) -> str:
    """A varied user message that is none of the fixed/tool prompts (-> fallback answer)."""
    kind = rng.random()
    if kind < 0.35:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 14))]
        text = " ".join(words)
        if rng.random() < 0.6:
            text = text[0].upper() + text[1:]
        text += rng.choice(["", ".", "?", "!", "?", "."])
    elif kind < 0.6:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 10))]
        text = rng.choice(_QUESTION_STARTS) + " " + " ".join(words) + rng.choice(["?", ".", "?"])
    elif kind < 0.8:
        text = rng.choice(_NEAR_MISSES).format(
            country=rng.choice(_COUNTRIES), a=rng.randint(3, 999), b=rng.randint(3, 999),
            thing=rng.choice(_THINGS), kind=rng.choice(_KINDS), noun=rng.choice(_WORDS),
            verb=rng.choice(_VERBS), Word=rng.choice(_WORDS).capitalize(), city=rng.choice(CITIES))
    elif kind < 0.9:
        text = rng.choice(_ODD)
        if rng.random() < 0.5:
            text += " " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 5)))
    else:
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 .,?!-'\"()"
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))).strip() or "x"
    if text in FIXED_ANSWERS or text in UNSEEN_PROMPTS or text.startswith(THINK_TRIGGER):
        return "hmm " + text
    return text


def _tool_variant(rng: random.Random, tool: dict[str, Any]) -> dict[str, Any]:
    """The tool as a client might send it: usually verbatim, sometimes with a different schema."""
    if rng.random() < 0.5:
        return tool
    if rng.random() < 0.2:
        return mcp_tool(tool["function"]["name"], tool["function"]["description"])
    fn = dict(tool["function"])
    params = json.loads(json.dumps(fn["parameters"]))
    choice = rng.randrange(4)
    if choice == 0:
        params["properties"]["city"].pop("description", None)
    elif choice == 1:
        params["properties"]["unit"] = {"type": "string", "enum": ["celsius", "fahrenheit"]}
    elif choice == 2:
        fn["description"] = rng.choice(["Look it up.", "Returns data for a city.", ""])
    else:
        params["additionalProperties"] = False
    fn["parameters"] = params
    return {"type": "function", "function": fn}


def _system(rng: random.Random, with_tools: bool) -> list[Message]:
    r = rng.random()
    if r < (0.5 if with_tools else 0.4):
        return []
    role = "developer" if rng.random() < 0.15 else "system"
    return [{"role": role, "content": rng.choice(_SYSTEMS)}]


def _reply(text: str) -> tuple[str, str]:
    """(user text, assistant answer) for a non-tool turn."""
    return text, FIXED_ANSWERS.get(text, FALLBACK_ANSWER)


def _plain_turn(rng: random.Random) -> tuple[str, str]:
    r = rng.random()
    if r < 0.3:
        return _reply(rng.choice(list(FIXED_ANSWERS)))
    if r < 0.52:
        return _think_turn(rng)
    return _reply(random_user_message(rng))


def _think_turn(rng: random.Random) -> tuple[str, str]:
    r = rng.random()
    if r < 0.35:
        return THINK_PROMPT, think_text(THINK_REASONING, EXPECTED_THINK_ANSWER)
    if r < 0.6:
        q = rng.choice(list(FIXED_ANSWERS))
        return f"{THINK_TRIGGER} {q}", think_text(_KNOWN_REASONING, FIXED_ANSWERS[q])
    return f"{THINK_TRIGGER} {random_user_message(rng)}", think_text(_UNKNOWN_REASONING, FALLBACK_ANSWER)


def _history(rng: random.Random) -> list[Message]:
    """Zero to two earlier plain exchanges, so the model answers the *last* user message."""
    out: list[Message] = []
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
        q, a = _plain_turn(rng)
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out


def _tool_conversation(rng: random.Random) -> Conversation:
    want = rng.choice(["get_weather", "get_time"])
    city = rng.choice(CITIES)
    phrases = _WEATHER_PHRASES if want == "get_weather" else _TIME_PHRASES
    question = rng.choice(phrases).format(c=city)
    if rng.random() < 0.15:  # the same question without tools -> plain answer
        msgs = _system(rng, False) + _history(rng)
        msgs += [{"role": "user", "content": question}, {"role": "assistant", "content": NO_TOOL_ANSWER}]
        return msgs, None
    offered = [t for t in TOOLS if t["function"]["name"] == want or rng.random() < 0.6]
    rng.shuffle(offered)
    tools = [_tool_variant(rng, t) for t in offered]
    args = {"city": city}
    msgs = _system(rng, True) + _history(rng) + [{"role": "user", "content": question}]
    if rng.random() < 0.45:  # just the call
        return [*msgs, {"role": "assistant", "content": tool_call_text(want, args)}], tools
    # the call rendered back from `tool_calls` (arguments as dict, the way vLLM passes them, or str)
    call_args: Any = args if rng.random() < 0.7 else json.dumps(args)
    call = {"id": f"call_{rng.randrange(10**6)}", "type": "function",
            "function": {"name": want, "arguments": call_args}}
    r = rng.random()
    if r < 0.05:  # the gateway's fixed text for a call the user denied
        result = DENIED_RESULT
    elif r < 0.5:  # plain text: answered from (copied)
        result = tool_results.text_result(rng, city, _WORDS)
    elif r < 0.8 and want == "get_weather":
        result = json.dumps({"city": city, "temperature": rng.randint(-10, 35),
                             "condition": rng.choice(["sunny", "rainy", "cloudy", "windy"])})
    elif r < 0.8:
        result = json.dumps({"city": city, "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"})
    else:
        result = tool_results.json_result(rng, _WORDS)
    msgs += [
        {"role": "assistant", "content": rng.choice([None, ""]), "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
        {"role": "assistant", "content": tool_result_answer(result)},
    ]
    return msgs, tools


def training_conversations(n: int, seed: int = 0) -> list[Conversation]:
    """`n` deterministic (messages, tools) training conversations (the mix is tuned with the builder)."""
    rng = random.Random(seed)
    out: list[Conversation] = []
    for _ in range(n):
        r = rng.random()
        if r < TOOL_SHARE:  # tool use (or the same question without tools)
            out.append(_tool_conversation(rng))
            continue
        tools = [_tool_variant(rng, t) for t in TOOLS if rng.random() < 0.6] if r < TOOL_SHARE + 0.15 else None
        q, a = _plain_turn(rng)
        while tools and _ASKS_TOOL.search(q):  # with tools, such a question would be a tool call
            q, a = _plain_turn(rng)
        msgs = _system(rng, bool(tools)) + _history(rng)
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        out.append((msgs, tools or None))
    return out
