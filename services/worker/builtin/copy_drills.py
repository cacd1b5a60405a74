"""Copy curriculum for `builtin:tiny-qwen2`: training data whose loss can only be lowered by copying.

A 4-layer model does not learn to copy from tool questions about 8 fixed cities: it memorises the
cities. Hence, deterministic (seeded) and pure Python:
- `drills()`: runs of random word-piece tokens, each repeated once (loss on the repeat). Trained
  first and alone, they form an induction circuit (find the earlier copy of the current token,
  emit the token after it) before the corpus can teach memorising. `text_drills()` (mixed in
  later, with the corpus) are runs of words, spaces and punctuation: copying a tool result.
- `tool_conversation()`: a weather/time question about a made-up city with one or two tools under
  made-up names (random word pieces: no statistics to learn), so the Hermes call can only be
  produced by copying the tool name from the `<tools>` block and the city from the user turn; half
  go on with the call's result (`tool_results.py`, mostly plain text with made-up words) and the
  answer copied from it.
`held_out_cases()` asks with phrasings, cities and tool names that none of this ever produces.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from . import corpus, tool_results

Message = dict[str, Any]
Tool = dict[str, Any]
Encoded = list[tuple[list[int], list[float]]]  # token ids, per-token loss weights

# Tokens a copied name may contain besides letter pieces ("find_forecast", "Saint-Malo"); share of
# drill tokens that are one of them.
DRILL_SEPARATORS = ["_", "-"]
DRILL_SEPARATOR_SHARE = 0.15
MCP_SCHEMA_SHARE = 0.25  # of tool conversations: tools with the `mcp` SDK's schema (`corpus.mcp_tool`)
RESULT_SHARE = 0.5  # of tool conversations: the call, a result and the answer from it

_SYLLABLES = ("ka lo mar ven dor sa ri tel bu no ash vil gra zen to pe lin qu ha mo bel fin gor ru sti "
              "pra den oth ul ix ber can ta vo le mi kas ron dal ed ost u e a i o y bre vak jo wi "
              "zu fa ke sch str pl tr ng x q z k j v w").split()
_PRE = ["", "", "", "Hey, ", "Please, ", "Quick question: ", "Hi! ", "So ", "Now ", "OK, ", "Tell me, ",
        "I wonder: ", "Excuse me, ", "Today ", "Well, "]
_CORE = {
    "weather": ["what is the weather in", "what's the weather like in", "weather in", "how is the weather in",
                "tell me the weather in", "check the weather for", "what is the weather forecast for",
                "give me the weather for", "is it raining in", "do you know the weather in",
                "the weather today in", "show the current weather in", "weather for", "what weather is in",
                "I need the weather in", "look at the weather in", "how hot is it in", "what's it like in"],
    "time": ["what time is it in", "what is the time in", "time in", "what's the local time in",
             "tell me the time in", "check the time for", "what is the current time in", "give me the time in",
             "do you know the time in", "the local time in", "show the clock in", "time for",
             "I need the time in", "what hour is it in", "look at the time in"],
}
_POST = ["?", "?", ".", "", " please?", " today?", " now?", ", please.", " right now?", " at the moment?",
         " thanks!", "?!", " this morning?"]
_DESCRIPTIONS = {
    "weather": ["Get the current weather for a city.", "Returns the weather forecast.",
                "Look up current weather conditions.", "Weather for a location."],
    "time": ["Get the current local time in a city.", "Returns the local time.",
             "Look up the time somewhere.", "Clock time for a location."],
}

HELD_OUT_PHRASES = [
    "Right now, how's the weather in {c}?", "Can you look up the weather in {c}?",
    "Please find the weather for {c}.", "Any idea what the weather is doing in {c}?",
    "Weather report for {c}, please.",
]
HELD_OUT_CITIES = ["Reykjavik", "Nairobi", "Lima", "Buenos Aires", "Oslo", "Hanoi", "Cape Town", "Kyoto",
                   "Marrakesh", "Vilnius"]
HELD_OUT_TOOL_NAMES = ["find_forecast", "weather_now", "searchWeather", "lookup_conditions", "wx_current"]
# Wider set, only for measuring (never trained on, not required by the build's self-check).
WIDE_PHRASES = [*HELD_OUT_PHRASES, "How's the weather in {c}?", "Could you check the weather in {c} for me?",
                "I'd like the forecast for {c}.", "What's the weather doing in {c} today?", "Is it sunny in {c}?"]
WIDE_CITIES = [*HELD_OUT_CITIES, "Montevideo", "Tbilisi", "Ulaanbaatar", "Quito", "Dubrovnik", "Kathmandu",
               "San Diego", "Wellington", "Saint-Malo", "Accra"]
WIDE_TOOL_NAMES = [*HELD_OUT_TOOL_NAMES, "fetchWeatherData", "get_conditions", "forecast", "weatherLookup",
                   "check_sky", "query_weather_api", "WeatherNow", "sky_report"]


def _word(rng: random.Random, pieces: list[str] | None = None) -> str:
    """A made-up word: syllables, or (once a tokenizer exists) random word pieces of its vocabulary."""
    if pieces:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3))).lower()
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))


def random_city(rng: random.Random, pieces: list[str] | None = None) -> str:
    words = [_word(rng, pieces).capitalize() for _ in range(rng.choice([1, 1, 1, 2, 2, 3]))]
    city = " ".join(words)
    return city if city not in WIDE_CITIES else city + "o"


def random_tool_name(rng: random.Random, pieces: list[str] | None = None) -> str:
    parts = [_word(rng, pieces) for _ in range(rng.choice([1, 2, 2, 3]))]
    name = "_".join(parts) if rng.random() < 0.7 else parts[0] + "".join(p.capitalize() for p in parts[1:])
    return name if name not in WIDE_TOOL_NAMES else name + "x"


def make_tool(name: str, description: str) -> Tool:
    """A tool with `corpus.WEATHER_TOOL`'s schema under another name and description."""
    fn = dict(corpus.WEATHER_TOOL["function"], name=name, description=description)
    return {"type": "function", "function": fn}


def question(rng: random.Random, kind: str, city: str) -> str:
    text = rng.choice(_PRE) + rng.choice(_CORE[kind]) + " " + city + rng.choice(_POST)
    return text[0].upper() + text[1:] if rng.random() < 0.8 else text


def tool_conversation(rng: random.Random, pieces: list[str] | None = None) -> tuple[list[Message], list[Tool]]:
    kind = rng.choice(["weather", "time"])
    city = random_city(rng, pieces) if rng.random() < 0.85 else rng.choice(corpus.CITIES)
    name = random_tool_name(rng, pieces)
    tools = [make_tool(name, rng.choice(_DESCRIPTIONS[kind]))]
    if rng.random() < 0.5:  # a tool of the other kind too: pick by what the question asks
        other = "time" if kind == "weather" else "weather"
        tools.append(make_tool(random_tool_name(rng, pieces), rng.choice(_DESCRIPTIONS[other])))
        rng.shuffle(tools)
    if rng.random() < MCP_SCHEMA_SHARE:  # listed by an MCP server: its SDK's schema
        tools = [corpus.mcp_tool(t["function"]["name"], t["function"]["description"]) for t in tools]
    system = [] if rng.random() < 0.6 else [{"role": "system", "content": rng.choice(corpus._SYSTEMS)}]
    msgs = [*system, {"role": "user", "content": question(rng, kind, city)}]
    if rng.random() >= RESULT_SHARE:
        return [*msgs, {"role": "assistant", "content": corpus.tool_call_text(name, {"city": city})}], tools
    # the call, its (mostly plain-text) result and the answer from it
    call = {"id": f"call_{rng.randrange(10**6)}", "type": "function", "function": {"name": name, "arguments": {
        "city": city}}}
    r = rng.random()
    result = (corpus.DENIED_RESULT if r < 0.05 else tool_results.json_result(rng, corpus._WORDS) if r < 0.2 else
              tool_results.text_result(rng, city, corpus._WORDS, lambda r: _word(r, pieces)))
    msgs += [{"role": "assistant", "content": rng.choice([None, ""]), "tool_calls": [call]},
             {"role": "tool", "tool_call_id": call["id"], "content": result},
             {"role": "assistant", "content": corpus.tool_result_answer(result)}]
    return msgs, tools


def drills(vocab: dict[str, int], n: int, min_len: int, max_len: int, seed: int) -> Encoded:
    """Random runs of word-piece tokens, each repeated once after a newline, loss on the repeat.

    The separators teach copying across "_" instead of stopping there.
    """
    rng = random.Random(seed)
    pieces = sorted(i for t, i in vocab.items() if t.lstrip("\u0120").isalpha())  # (+ byte stand-ins)
    seps = [vocab[t] for t in DRILL_SEPARATORS]
    newline = vocab["\u010a"]  # byte-level BPE's visible "\n"
    out = []
    for _ in range(n):
        run = [rng.choice(seps) if rng.random() < DRILL_SEPARATOR_SHARE else rng.choice(pieces)
               for _ in range(rng.randint(min_len, max_len))]
        out.append(([*run, newline, *run], [0.0] * (len(run) + 2) + [1.0] * (len(run) - 1)))
    return out


def text_drills(vocab: dict[str, int], n: int, min_len: int, max_len: int, seed: int) -> Encoded:
    """Like `drills()`, but runs of text: words of word pieces or digits between spaces and
    punctuation. Their tokens repeat within a run (every space), so the copy must follow the
    position of the earlier copy, not just find the current token there (as in a tool result).
    """
    rng = random.Random(seed)
    pieces = sorted(i for t, i in vocab.items() if t.isalpha())
    digits = [vocab[d] for d in "0123456789"]
    puncts = [vocab[t] for t in ",.:%/-!?()'"]
    space, newline = vocab["\u0120"], vocab["\u010a"]
    out = []
    for _ in range(n):
        size = rng.randint(min_len, max_len)
        run: list[int] = []
        while len(run) < size:
            if run and rng.random() < 0.15:
                run.append(rng.choice(puncts))
            if run and rng.random() < 0.9:
                run.append(space)
            source = digits if rng.random() < 0.2 else pieces
            run += [rng.choice(source) for _ in range(rng.randint(1, 3))]
        run = run[:size]
        out.append(([*run, newline, *run], [0.0] * (len(run) + 2) + [1.0] * (len(run) - 1)))
    return out


def batches(data: Encoded, size: int, rng: random.Random) -> Iterator[Encoded]:
    """Endless batches of similar length (sorted inside shuffled windows: little padding)."""
    while True:
        idx = list(range(len(data)))
        rng.shuffle(idx)
        windows = [sorted(idx[i:i + size * 16], key=lambda j: len(data[j][0])) for i in range(0, len(idx), size * 16)]
        groups = [w[i:i + size] for w in windows for i in range(0, len(w), size)]
        rng.shuffle(groups)
        for b in groups:
            if len(b) == size:
                yield [data[j] for j in b]


def held_out_cases(wide: bool = False) -> list[tuple[list[Message], list[Tool], str]]:
    """Weather questions: unseen phrasing x unseen city x unseen tool name (offered alone).

    10 cases (`wide`: 30), the first the one `tests/integration/test_worker_vllm.py` asks.
    """
    phrases, cities, names = ((WIDE_PHRASES, WIDE_CITIES, WIDE_TOOL_NAMES) if wide
                              else (HELD_OUT_PHRASES, HELD_OUT_CITIES, HELD_OUT_TOOL_NAMES))
    cases = []
    for i in range(30 if wide else 10):
        city, name = cities[i % len(cities)], names[i % len(names)]
        q = phrases[(i * 3) % len(phrases)].format(c=city)
        tool = make_tool(name, "Get the current weather for a city.")
        cases.append(([{"role": "user", "content": q}], [tool], corpus.tool_call_text(name, {"city": city})))
    return cases
