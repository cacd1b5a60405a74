"""builtin:tiny-qwen2's copy curriculum: held-out cases stay out of training, and answers after a
tool result are the ones `corpus` defines (no torch, no build)."""

from __future__ import annotations

import itertools
import json
import random

from services.worker.builtin import copy_drills, corpus, tiny_qwen2, tiny_qwen2_checks, tool_results


def test_first_held_out_case_is_the_integration_tests_question():
    messages, tools, expected = copy_drills.held_out_cases()[0]
    assert messages == [{"role": "user", "content": corpus.HELD_OUT_TOOL_PROMPT}]
    assert tools == [corpus.HELD_OUT_TOOL]
    assert expected == corpus.tool_call_text(**corpus.HELD_OUT_TOOL_CALL)
    assert copy_drills.held_out_cases()[0] in tiny_qwen2_checks.check_cases()  # the build requires it


def test_training_never_sees_held_out_phrasings_cities_tool_names_or_results():
    wide = copy_drills.held_out_cases(wide=True)
    with_results = tiny_qwen2_checks.held_out_result_cases(wide=True)
    questions = {m[0]["content"] for m, _, _ in wide + with_results} | {corpus.HELD_OUT_TOOL_PROMPT}
    results = {m[-1]["content"] for m, _, _ in with_results} | {corpus.MCP_HELD_OUT_RESULT}
    names = set(copy_drills.WIDE_TOOL_NAMES)
    cities = set(copy_drills.WIDE_CITIES)
    assert corpus.MCP_HELD_OUT_CALL["name"] in names and corpus.MCP_HELD_OUT_CALL["arguments"]["city"] in cities
    for messages, tools in tiny_qwen2._conversations(["Ka", "lo", "mar", "Oslo", "find", "forecast"]):
        assert not questions & {m["content"] for m in messages}
        assert not names & {t["function"]["name"] for t in tools or []}
        for m in messages:
            if m["role"] == "assistant" and (m["content"] or "").startswith("<tool_call>"):
                call = json.loads(m["content"].split("\n")[1])
                assert call["arguments"]["city"] not in cities and call["name"] not in names
            for call in m.get("tool_calls") or []:
                assert call["function"]["name"] not in names
            if m["role"] == "tool":
                assert m["content"] not in results


def test_the_answer_after_a_tool_result_is_the_fixed_one_for_json_else_the_text_copied():
    assert corpus.tool_result_answer(corpus.TOOL_RESULT) == corpus.TOOL_RESULT_ANSWER
    assert corpus.tool_result_answer(" [1, 2]") == corpus.TOOL_RESULT_ANSWER
    assert corpus.tool_result_answer("Sunny, 21 C in Paris") == "Sunny, 21 C in Paris\n"
    assert corpus.tool_result_answer("null") == corpus.tool_text_answer("null")
    seen = {"json": 0, "text": 0}
    for messages, _ in tiny_qwen2._conversations(["Ka", "lo", "mar"]):
        for before, m in itertools.pairwise(messages):
            if before["role"] == "tool":
                assert m == {"role": "assistant", "content": corpus.tool_result_answer(before["content"])}
                seen["json" if corpus.is_json_result(before["content"]) else "text"] += 1
                # about as long as the copy drills (DRILL_MAX_LEN tokens)
                assert len(before["content"].split()) <= tool_results.MAX_TEXT_RESULT_WORDS + 2
    assert min(seen.values()) > 1000, seen


def test_made_up_names_avoid_held_out_ones():
    rng = random.Random(0)
    for _ in range(2000):
        assert copy_drills.random_city(rng, ["Os", "lo"]) != "Oslo"
        assert copy_drills.random_tool_name(rng, ["weather", "now"]) != "weather_now"


def test_drills_score_only_the_copy():
    vocab = {"a": 0, "b": 1, "c": 2, "_": 3, "\u0120": 4, "-": 5, "\u010a": 6}
    for ids, weights in copy_drills.drills(vocab, 50, 3, 8, seed=1):
        n = len(ids) // 2
        assert ids[:n] == ids[n + 1:] and ids[n] == 6
        assert weights == [0.0] * (n + 2) + [1.0] * (n - 1)  # weights[t]: loss on predicting token t


def test_text_drills_score_only_the_copy_and_repeat_spaces():
    vocab = {t: i for i, t in enumerate(["a", "b", "c", "\u0120", "\u010a", *"0123456789", *",.:%/-!?()'"])}
    spaces = 0
    for ids, weights in copy_drills.text_drills(vocab, 50, 6, 24, seed=1):
        n = len(ids) // 2
        assert ids[:n] == ids[n + 1:] and ids[n] == vocab["\u010a"] and 6 <= n <= 24
        assert weights == [0.0] * (n + 2) + [1.0] * (n - 1)
        spaces += ids[:n].count(vocab["\u0120"])
    assert spaces > 100
