import json

import pytest

from services.worker.parsers import StreamParser, opens_reasoning

THINK = "<think>17 + 25 = 42.</think>\nThe answer is 42."
TOOL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def run(text: str, chunk: int, **kw):
    parser = StreamParser(**kw)
    outs = [parser.feed(text[i:i + chunk]) for i in range(0, len(text), chunk)] + [parser.finish()]
    return ("".join(o.text for o in outs), "".join(o.reasoning for o in outs),
            [(c.name, json.loads(c.arguments)) for o in outs for c in o.tool_calls])


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 100])
def test_reasoning_split_at_any_chunking(chunk):
    assert run(THINK, chunk, reasoning=True, tools=True) == ("The answer is 42.", "17 + 25 = 42.", [])


@pytest.mark.parametrize("chunk", [1, 4, 11, 100])
def test_tool_calls_at_any_chunking(chunk):
    text, reasoning, calls = run(TOOL + "\n" + TOOL, chunk, reasoning=True, tools=True)
    assert (text, reasoning) == ("", "")
    assert calls == [("get_weather", {"city": "Paris"})] * 2


def test_tool_call_indices_and_ids():
    parser = StreamParser(reasoning=False, tools=True)
    calls = parser.feed(TOOL + TOOL).tool_calls
    assert [c.index for c in calls] == [0, 1] and calls[0].id != calls[1].id and parser.tool_calls == 2


def test_tags_are_plain_text_when_parsing_is_off():
    assert run(THINK + TOOL, 3, reasoning=False, tools=False) == (THINK + TOOL, "", [])


def test_partial_tag_is_held_back_then_released():
    parser = StreamParser(reasoning=False, tools=True)
    assert parser.feed("a <tool").text == "a "
    assert parser.feed("s are fun").text == "<tools are fun"


def test_malformed_or_unterminated_call_falls_back_to_text():
    assert run("<tool_call>{not json}</tool_call>", 4, reasoning=False, tools=True)[0] == \
        "<tool_call>{not json}</tool_call>"
    assert run('<tool_call>{"name": "x"', 4, reasoning=False, tools=True)[0] == '<tool_call>{"name": "x"'


def test_think_only_counts_at_the_start():
    assert run("Hello <think>x</think>", 2, reasoning=True, tools=False) == ("Hello <think>x</think>", "", [])


def test_unterminated_reasoning_stays_reasoning():
    assert run("<think>still thinking", 3, reasoning=True, tools=False) == ("", "still thinking", [])


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 100])
def test_a_think_block_the_prompt_opened_is_reasoning_at_any_chunking(chunk):
    """The chat template opened `<think>` (Qwen3 thinking, DeepSeek-R1-0528): the output holds only
    `</think>`; it starts as reasoning and no `</think>` reaches the content."""
    assert run("17 + 25 = 42.</think>\n\nThe answer is 42.", chunk, reasoning=True, tools=True, opened=True) == (
        "The answer is 42.", "17 + 25 = 42.", [])
    assert run("42</think>" + TOOL, chunk, reasoning=True, tools=True, opened=True) == (
        "", "42", [("get_weather", {"city": "Paris"})])


def test_an_opened_think_block_counts_only_with_reasoning_on():
    assert run("x</think>y", 2, reasoning=False, tools=False, opened=True) == ("x</think>y", "", [])
    assert StreamParser(reasoning=True, tools=False, opened=True).in_reasoning


@pytest.mark.parametrize("tail, opened", [
    ("<|im_start|>assistant\n<think>\n", True), ("<｜Assistant｜><think>", True), ("<think>\n\n", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # thinking switched off by the template
    ("<|im_start|>assistant\n", False), ("", False), ("say <think> then", False)])
def test_a_prompt_opens_reasoning_only_when_it_ends_in_think(tail, opened):
    assert opens_reasoning(tail) is opened
