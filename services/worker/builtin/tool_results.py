"""Tool results for `builtin:tiny-qwen2`'s corpus: what a tool may answer, and so what the model is
trained to answer from (pure Python, deterministic with the caller's `random.Random`).

- `text_result()`: plain text (weather/time sentences about the city, words, numbers, errors) of at
  most `MAX_TEXT_RESULT_WORDS` words, about the ~24 tokens the copy drills train; the model answers
  `corpus.tool_text_answer(result)`, copying it.
- `json_result()`: a JSON object or array of any shape; the model answers the fixed
  `corpus.TOOL_RESULT_ANSWER`, whatever it holds.
`tiny_qwen2_checks.held_out_result_cases()` measures answering from results no template here
produces, about cities and tool names never trained.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

MAX_TEXT_RESULT_WORDS = 8

_CONDITIONS = ["sunny", "rainy", "cloudy", "windy", "foggy", "clear", "stormy", "snowing", "light rain",
               "heavy rain", "hot", "cold", "mild", "overcast", "partly cloudy", "hail"]
_TEXT_RESULTS = [
    "{C}, {t} C in {city}", "{C} and {t} C in {city}.", "It is {c} in {city}.", "{city}: {c}, {t} C",
    "{t} C, {c}", "{C}", "{t} degrees and {c}", "The weather in {city} is {c}.", "{C} in {city}, {t} C.",
    "The time in {city} is {h}:{m}.", "{h}:{m} in {city}", "{city} {h}:{m}", "{h}:{m}", "It is {h}:{m} now.",
    "No data for {city}.", "Error: {words}", "error: {words}", "{words}", "{Words}.", "{Words}", "{n}",
    "{n} {word}", "{Word} {n}, {word} {n2}", "OK", "ok", "null", "true", "false", "done",
    "{city} is {c} today.", "{Word}: {words}", "The user did not {words}.",
]


def text_result(rng: random.Random, city: str, words: Sequence[str],
                made_up: Callable[[random.Random], str] | None = None) -> str:
    """A plain-text result about `city`: `words` are real words; `made_up(rng)` (if given) makes up others."""
    def pick() -> str:
        return made_up(rng) if made_up and rng.random() < 0.5 else rng.choice(words)

    w = " ".join(pick() for _ in range(rng.randint(1, MAX_TEXT_RESULT_WORDS - 3)))
    c = rng.choice(_CONDITIONS)
    return rng.choice(_TEXT_RESULTS).format(
        C=c.capitalize(), c=c, t=rng.randint(-20, 40), city=city, h=f"{rng.randint(0, 23):02d}",
        m=f"{rng.randint(0, 59):02d}", words=w, Words=w[0].upper() + w[1:], n=rng.randint(-100, 10000),
        n2=rng.randint(0, 999), word=rng.choice(words), Word=rng.choice(words).capitalize())


def json_result(rng: random.Random, words: Sequence[str]) -> str:
    """JSON of any shape: the answer after a JSON result must not depend on its content."""
    if rng.random() < 0.8:
        keys = rng.sample(list(words), rng.randint(1, 4))
        return json.dumps({k: rng.choice([rng.randint(-50, 500), rng.choice(words), rng.random() < 0.5])
                           for k in keys})
    return rng.choice(["[]", "{}", json.dumps([rng.randint(0, 99) for _ in range(rng.randint(1, 4))]),
                       json.dumps([rng.choice(words) for _ in range(rng.randint(1, 3))])])
