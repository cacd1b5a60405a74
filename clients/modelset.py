"""models.yaml -> ModelSpec list, validated strictly: every error names the file, the key and the fix.

models:
  - name: chat                    # the OpenAI `model` id
    model: builtin:gemma-3-270m   # builtin:NAME, a Hugging Face id or a local path
    loader: vllm                  # vllm | llama_cpp (GGUF: a .gguf path, hf:ORG/REPO/FILE.gguf, a builtin)
                                  # | piper (speech: builtin:piper-joe or a voice .onnx)
                                  # | faster_whisper (transcription: builtin:whisper-base or a CTranslate2 dir)
    usecase: generate             # generate | embed | speech | transcription (the audio loaders' own by default)
    num_cpus: 0.5
    num_gpus: 0
    num_replicas: 1               # or autoscaling_config: {min_replicas, max_replicas, ...}
    max_model_len: 2048
    max_num_seqs: 16
    engine_args: {enable_prefix_caching: true}
    tool_parser: hermes           # hermes | none
    reasoning_parser: think       # think | none
    rate_limits: {requests_per_minute: 600, tokens_per_minute: 200000}  # per identity; 0 = unlimited
    max_ongoing_requests: 64      # per replica: requests its engine works on at once (default 64)
    max_queued_requests: 256      # per replica: requests waiting for a place (default 256; 0 = none);
                                  # past both: 503 + Retry-After at once
    stall_timeout_s: 300          # an engine with requests in it and no progress this long is hung:
                                  # killed, its replica replaced (default 300; 0 = never)
    # llama_cpp only: n_ctx (per request), n_parallel (slots), n_threads, n_gpu_layers,
    # chat_template (Jinja), embeddings (= usecase: embed), llama_server_binary (an operator's
    # build), llama_server_args: [...]
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import struct_pb2

from mship.common.v1 import common_pb2
from services.common.vocabulary import (
    AUDIO_BUILTINS,
    GGUF_BUILTINS,
    LLAMA_CPP_KEYS,
    LLAMA_RUNTIMES,
    LOADER_USECASES,
    LOADERS,
    MODEL_NAME,
    REASONING_PARSERS,
    TOOL_PARSERS,
    USECASES,
)

AUTOSCALING_KEYS = {"min_replicas": int, "max_replicas": int, "target_ongoing_requests": float,
                    "upscale_delay_s": float, "downscale_delay_s": float}
MODEL_KEYS = {"name", "model", "loader", "usecase", "num_cpus", "num_gpus", "num_replicas", "autoscaling_config",
              "max_model_len", "max_num_seqs", "engine_args", "tool_parser", "reasoning_parser", "rate_limits",
              "max_ongoing_requests", "max_queued_requests", "stall_timeout_s", *LLAMA_CPP_KEYS}
RATE_LIMIT_KEYS = ("requests_per_minute", "tokens_per_minute")


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, problem: str, fix: str) -> None:
        self.source, self.key, self.problem, self.fix = source, key, problem, fix
        super().__init__(f"{source}: {key}: {problem}. Fix: {fix}")


def load_model_set(path: str | Path) -> list[common_pb2.ModelSpec]:
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(source, "(file)", f"cannot read it ({e.strerror})", "pass an existing models.yaml") from e
    except UnicodeDecodeError as e:
        raise ConfigError(source, "(file)", f"not UTF-8 text (byte {e.start}: {e.reason})", "save it as UTF-8") \
            from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(source, "(file)", f"not valid YAML ({e})", "correct the YAML syntax") from e
    if not isinstance(data, dict) or set(data) != {"models"}:
        raise ConfigError(source, "(top level)", "expected exactly one key, `models`",
                          "write `models:` followed by a list of models")
    return parse_models(data["models"], source)


def parse_models(models: Any, source: str) -> list[common_pb2.ModelSpec]:
    if not isinstance(models, list) or not models:
        raise ConfigError(source, "models", "expected a non-empty list", "list at least one model under `models:`")
    specs, seen = [], {}
    for i, entry in enumerate(models):
        spec = parse_model(entry, source, f"models[{i}]")
        if spec.name in seen:
            raise ConfigError(source, f"models[{i}].name",
                              f"duplicate name {spec.name!r} (also models[{seen[spec.name]}])",
                              "give every model a distinct name")
        seen[spec.name] = i
        specs.append(spec)
    return specs


def parse_model(entry: Any, source: str, where: str) -> common_pb2.ModelSpec:
    if not isinstance(entry, dict):
        raise ConfigError(source, where, "expected a mapping", "write `- name: ...` and `model: ...`")
    unknown = sorted(set(entry) - MODEL_KEYS, key=str)  # YAML keys may be numbers too
    if unknown:
        raise ConfigError(source, f"{where}.{unknown[0]}", "unknown key",
                          f"remove it; known keys: {', '.join(sorted(MODEL_KEYS))}")
    spec = common_pb2.ModelSpec()
    for key in ("name", "model"):
        value = entry.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(source, f"{where}.{key}", "required, a non-empty string", f"set `{key}:`")
    if not MODEL_NAME.match(entry["name"]):
        raise ConfigError(source, f"{where}.name", f"{entry['name']!r} is not a valid model name",
                          "use letters, digits and . _ : - (at most 64 characters)")
    spec.name, spec.model = entry["name"], entry["model"]
    spec.loader = _choice(entry, "loader", LOADERS, "vllm", source, where)
    loader = entry.get("loader", "vllm")
    spec.usecase = _choice(entry, "usecase", USECASES, LOADER_USECASES.get(loader, "generate"), source, where)
    _audio(entry, loader, source, where)
    if spec.loader == common_pb2.LOADER_LLAMA_CPP:
        _llama_cpp(entry, spec, source, where)
    elif (llama_only := sorted(set(entry) & set(LLAMA_CPP_KEYS))):
        raise ConfigError(source, f"{where}.{llama_only[0]}", "a llama_cpp setting on another loader",
                          "set `loader: llama_cpp`, or remove it (vLLM takes engine_args)")
    spec.num_cpus = _number(entry, "num_cpus", float, 0.0, source, where)
    spec.num_gpus = _number(entry, "num_gpus", float, 0.0, source, where)
    spec.max_model_len = _number(entry, "max_model_len", int, 0, source, where)
    spec.max_num_seqs = _number(entry, "max_num_seqs", int, 0, source, where)
    spec.tool_parser = _choice_str(entry, "tool_parser", TOOL_PARSERS, source, where)
    spec.reasoning_parser = _choice_str(entry, "reasoning_parser", REASONING_PARSERS, source, where)
    if "num_replicas" in entry and "autoscaling_config" in entry:
        raise ConfigError(source, f"{where}.num_replicas", "num_replicas and autoscaling_config exclude each other",
                          "keep one of them")
    spec.num_replicas = _number(entry, "num_replicas", int, 1, source, where, minimum=1)
    if "autoscaling_config" in entry:
        spec.autoscaling.CopyFrom(_autoscaling(entry["autoscaling_config"], source, f"{where}.autoscaling_config"))
        spec.num_replicas = 0
    if "max_ongoing_requests" in entry:
        spec.max_ongoing_requests = _number(entry, "max_ongoing_requests", int, 0, source, where, minimum=1)
    if "max_queued_requests" in entry:
        spec.max_queued_requests = _number(entry, "max_queued_requests", int, 0, source, where)
    if "stall_timeout_s" in entry:
        spec.stall_timeout_s = _number(entry, "stall_timeout_s", float, 0.0, source, where)
    if "rate_limits" in entry:
        _rate_limits(entry["rate_limits"], spec.rate_limits, source, f"{where}.rate_limits")
    if "engine_args" in entry:
        args = entry["engine_args"]
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            raise ConfigError(source, f"{where}.engine_args", "expected a mapping of engine argument names",
                              "write e.g. `engine_args: {enable_prefix_caching: true}`")
        spec.engine_args.CopyFrom(_engine_args(args, source, f"{where}.engine_args"))
    return spec


def _llama_cpp(entry: dict, spec: common_pb2.ModelSpec, source: str, where: str) -> None:
    ref = entry["model"]
    if ref.startswith("builtin:") and ref.removeprefix("builtin:") not in GGUF_BUILTINS:
        raise ConfigError(source, f"{where}.model", f"{ref} has no GGUF for llama_cpp",
                          f"use one of {', '.join('builtin:' + n for n in GGUF_BUILTINS)}, a .gguf path or "
                          "hf:ORG/REPO/FILE.gguf")
    if not ref.startswith(("builtin:", "hf:")) and not ref.endswith(".gguf"):
        raise ConfigError(source, f"{where}.model", f"{ref!r} is not a GGUF model",
                          "the llama_cpp loader serves .gguf files (a local path or hf:ORG/REPO/FILE.gguf)")
    o = spec.llama_cpp
    for key in ("n_ctx", "n_parallel", "n_threads"):
        setattr(o, LLAMA_CPP_KEYS[key], _number(entry, key, int, 0, source, where))
    if "n_gpu_layers" in entry:
        o.n_gpu_layers = _number(entry, "n_gpu_layers", int, 0, source, where, minimum=-1)
    for key in ("chat_template", "llama_server_binary"):
        value = entry.get(key, "")
        if not isinstance(value, str):
            raise ConfigError(source, f"{where}.{key}", "expected a string", f"set `{key}:` to a string")
        setattr(o, LLAMA_CPP_KEYS[key], value)
    runtime = entry.get("llama_runtime", "")
    if not isinstance(runtime, str) or (runtime and runtime not in LLAMA_RUNTIMES):
        raise ConfigError(source, f"{where}.llama_runtime", f"unknown llama_runtime {runtime!r}",
                          f"use one of {', '.join(LLAMA_RUNTIMES)}")
    o.runtime = runtime
    args = entry.get("llama_server_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(source, f"{where}.llama_server_args", "expected a list of strings",
                          'write e.g. `llama_server_args: ["--flash-attn", "on"]`')
    o.server_args.extend(args)
    if "embeddings" in entry:
        wanted = entry["embeddings"]
        if not isinstance(wanted, bool):
            raise ConfigError(source, f"{where}.embeddings", "expected true or false", "write `embeddings: true`")
        usecase = common_pb2.USECASE_EMBED if wanted else common_pb2.USECASE_GENERATE
        if "usecase" in entry and spec.usecase != usecase:
            raise ConfigError(source, f"{where}.embeddings", "contradicts `usecase:`", "keep one of them")
        spec.usecase = usecase


def _audio(entry: dict, loader: str, source: str, where: str) -> None:
    """The audio loaders serve their one usecase, and the audio builtins need their loader."""
    own = LOADER_USECASES.get(loader)
    if own is not None and entry.get("usecase", own) != own:
        raise ConfigError(source, f"{where}.usecase", f"the {loader} loader serves `usecase: {own}` only",
                          f"write `usecase: {own}`, or leave it out")
    if own is None and entry.get("usecase") in LOADER_USECASES.values():
        wanted = [name for name, usecase in LOADER_USECASES.items() if usecase == entry["usecase"]]
        raise ConfigError(source, f"{where}.usecase", f"`usecase: {entry['usecase']}` needs an audio loader",
                          f"set `loader: {wanted[0]}`")
    ref = entry["model"]
    if not ref.startswith("builtin:"):
        return
    name = ref.removeprefix("builtin:")
    for audio_loader, names in AUDIO_BUILTINS.items():
        if name in names and loader != audio_loader:
            raise ConfigError(source, f"{where}.loader", f"{ref} is served by the {audio_loader} loader",
                              f"set `loader: {audio_loader}`")
    if own is not None and name not in AUDIO_BUILTINS[loader]:
        raise ConfigError(source, f"{where}.model", f"{ref} is no model of the {loader} loader",
                          f"use one of {', '.join('builtin:' + n for n in AUDIO_BUILTINS[loader])} or a local path")


def _engine_args(args: dict, source: str, where: str) -> struct_pb2.Struct:
    """engine_args as the JSON-like Struct they travel in; a value it cannot carry (a YAML date, an
    integer past 2**53) is refused, not turned into something else or a traceback."""
    def check(value: Any, at: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise ConfigError(source, f"{at}.{k}", "a key that is not a string", f"quote it: '{k}'")
                check(v, f"{at}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                check(v, f"{at}[{i}]")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
            raise ConfigError(source, at, f"{value} is past 2**53, which engine_args (JSON numbers) cannot carry "
                              "exactly", "quote it as a string if the engine takes one, or use a smaller number")
        elif value is not None and not isinstance(value, str | int | float):
            raise ConfigError(source, at, f"a {type(value).__name__} value ({value!r}), which engine_args cannot "
                              "carry", "quote it (e.g. '2024-01-01'), or use a number, true/false, a list or a mapping")

    check(args, where)
    struct = struct_pb2.Struct()
    struct.update(args)
    return struct


def _choice(entry: dict, key: str, choices: dict[str, int], default: str, source: str, where: str) -> int:
    value = entry.get(key, default)
    if not isinstance(value, str) or value not in choices:  # a list or mapping is no choice (and unhashable)
        raise ConfigError(source, f"{where}.{key}", f"unknown {key} {value!r}", f"use one of: {', '.join(choices)}")
    return choices[value]


def _choice_str(entry: dict, key: str, choices: tuple[str, ...], source: str, where: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or (value != "" and value not in choices):
        raise ConfigError(source, f"{where}.{key}", f"unknown {key} {value!r}", f"use one of: {', '.join(choices)}")
    return value


def _number(entry: dict, key: str, kind: type, default: Any, source: str, where: str, minimum: float = 0) -> Any:
    value = entry.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
    if not ok or not minimum <= value < math.inf:  # YAML's .nan and .inf are floats too
        what = "an integer" if kind is int else "a number"
        raise ConfigError(source, f"{where}.{key}", f"expected {what} >= {minimum}, got {value!r}",
                          f"set `{key}:` to {what} >= {minimum}")
    return kind(value)


def _rate_limits(cfg: Any, out: common_pb2.RateLimits, source: str, where: str) -> None:
    if not isinstance(cfg, dict):
        raise ConfigError(source, where, "expected a mapping",
                          "write `rate_limits: {requests_per_minute: 600, tokens_per_minute: 200000}`")
    unknown = sorted(set(cfg) - set(RATE_LIMIT_KEYS))
    if unknown:
        raise ConfigError(source, f"{where}.{unknown[0]}", "unknown key",
                          f"remove it; known keys: {', '.join(RATE_LIMIT_KEYS)}")
    for key in RATE_LIMIT_KEYS:
        setattr(out, key, _number(cfg, key, int, 0, source, where))


def _autoscaling(cfg: Any, source: str, where: str) -> common_pb2.AutoscalingConfig:
    if not isinstance(cfg, dict):
        raise ConfigError(source, where, "expected a mapping", "write `autoscaling_config: {min_replicas: 1, ...}`")
    unknown = sorted(set(cfg) - set(AUTOSCALING_KEYS))
    if unknown:
        raise ConfigError(source, f"{where}.{unknown[0]}", "unknown key",
                          f"remove it; known keys: {', '.join(AUTOSCALING_KEYS)}")
    out = common_pb2.AutoscalingConfig(
        min_replicas=_number(cfg, "min_replicas", int, 1, source, where, minimum=0),
        max_replicas=_number(cfg, "max_replicas", int, 1, source, where, minimum=1),
        target_ongoing_requests=_number(cfg, "target_ongoing_requests", float, 2.0, source, where),
        upscale_delay_s=_number(cfg, "upscale_delay_s", float, 1.0, source, where),
        downscale_delay_s=_number(cfg, "downscale_delay_s", float, 30.0, source, where))
    if out.max_replicas < out.min_replicas:
        raise ConfigError(source, f"{where}.max_replicas", "smaller than min_replicas", "raise max_replicas")
    return out
