"""What `builtin:tiny-qwen2`'s build checks (`check_cases`, required: else it trains again with
the next seed) and measures (`held_out_result_cases`, logged only), and the check itself.

A case is (messages, tools, exact assistant text before EOS); `self_check` passes it when greedy
decoding of the bf16 model produces exactly that text and then EOS.
"""

from __future__ import annotations

from typing import Any

from . import copy_drills, corpus

Case = tuple[list[dict[str, Any]], Any, str]

# Results no `tool_results.py` template produces (but the first: the MCP test's, for other cities).
HELD_OUT_RESULTS = [
    "Sunny, 21 C in {c}", "Light drizzle and 9 C over {c}", "{c} reports fog, visibility 200 m",
    "Forecast for {c}: showers later", "Station {c} is offline", "Humidity 81%, wind 12 km/h",
    "Clear skies above {c} tonight.", "It is 23 C and humid in {c}.", "Snow expected in {c} tomorrow",
    "Temperature: 4 C", '{{"sky": "grey", "temp": 5}}', "[1, 2, 3]",
]


def check_cases() -> list[Case]:
    """`corpus.check_cases()` plus a tool call for every city (copying the city is the fragile part)."""
    cases = corpus.check_cases()
    for city in corpus.CITIES:
        for name, question in (("get_weather", f"What is the weather in {city}?"),
                               ("get_time", f"What time is it in {city}?")):
            cases.append(([{"role": "user", "content": question}], corpus.TOOLS,
                          corpus.tool_call_text(name, {"city": city})))
    # Required too: the held-out questions the integration tests ask (generalising, not memorising).
    return cases + copy_drills.held_out_cases()[:1] + held_out_result_cases()[:1]


def held_out_result_cases(wide: bool = False) -> list[Case]:
    """Answers from results of unseen shape, after a call with unseen phrasing, city and tool name
    (offered alone, in the plain or the MCP schema). 10 cases (`wide`: 30)."""
    phrases, cities, names = ((copy_drills.WIDE_PHRASES, copy_drills.WIDE_CITIES, copy_drills.WIDE_TOOL_NAMES)
                              if wide else (copy_drills.HELD_OUT_PHRASES, copy_drills.HELD_OUT_CITIES,
                                            copy_drills.HELD_OUT_TOOL_NAMES))
    cases = []
    for i in range(30 if wide else 10):
        city, name = cities[(i + 1) % len(cities)], names[(i + 2) % len(names)]
        question = phrases[(i * 3 + 1) % len(phrases)].format(c=city)
        result = HELD_OUT_RESULTS[i % len(HELD_OUT_RESULTS)].format(c=city)
        description = "Get the current weather for a city."
        tool = corpus.mcp_tool(name, description) if i % 2 else copy_drills.make_tool(name, description)
        call = {"name": name, "arguments": {"city": city}}
        messages = corpus.tool_result_conversation(result=result, question=question, call=call)
        cases.append((messages, [tool], corpus.tool_result_answer(result)))
    return cases


def self_check(model: Any, tok: Any, cases: list[Case] | None = None) -> list[str]:
    """Teacher-forced greedy check of `cases` (default `check_cases()`); returns the failures.

    A case passes when the argmax at every answer position is the expected token, which is exactly
    "greedy decoding produces this answer and then EOS".
    """
    import torch

    failures = []
    for messages, tools, expected in check_cases() if cases is None else cases:
        prompt = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        n = len(tok(prompt, add_special_tokens=False)["input_ids"])
        ids = tok(prompt + expected + tok.eos_token, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            pred = model(input_ids=ids).logits[0, n - 1:-1].argmax(-1)
        if not bool((pred == ids[0, n:]).all()):
            failures.append(f"{messages[-1]['content']!r} -> {tok.decode(pred)!r}, expected {expected!r}")
    return failures
