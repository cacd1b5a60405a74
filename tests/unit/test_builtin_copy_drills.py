"""builtin:tiny-qwen2's copy curriculum: held-out cases stay out of training (no torch, no build)."""

from __future__ import annotations

import json
import random

from services.worker.builtin import copy_drills, corpus, tiny_qwen2


def test_first_held_out_case_is_the_integration_tests_question():
    messages, tools, expected = copy_drills.held_out_cases()[0]
    assert messages == [{"role": "user", "content": corpus.HELD_OUT_TOOL_PROMPT}]
    assert tools == [corpus.HELD_OUT_TOOL]
    assert expected == corpus.tool_call_text(**corpus.HELD_OUT_TOOL_CALL)
    assert copy_drills.held_out_cases()[0] in tiny_qwen2._check_cases()  # the build requires it


def test_training_never_sees_held_out_phrasings_cities_or_tool_names():
    wide = copy_drills.held_out_cases(wide=True)
    questions = {m[-1]["content"] for m, _, _ in wide} | {corpus.HELD_OUT_TOOL_PROMPT}
    names = set(copy_drills.WIDE_TOOL_NAMES)
    cities = set(copy_drills.WIDE_CITIES)
    for messages, tools in tiny_qwen2._conversations(["Ka", "lo", "mar", "Oslo", "find", "forecast"]):
        assert not questions & {m["content"] for m in messages}
        assert not names & {t["function"]["name"] for t in tools or []}
        for m in messages:
            if m["role"] == "assistant" and (m["content"] or "").startswith("<tool_call>"):
                call = json.loads(m["content"].split("\n")[1])
                assert call["arguments"]["city"] not in cities and call["name"] not in names


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
