"""models.yaml and `--model` flags: validated before anything is sent, errors name file, key and fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clients.modelset import ConfigError, load_model_set
from mship.common.v1 import common_pb2

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def test_a_valid_model_set_parses(tmp_path):
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: builtin:tiny-qwen2\n"
                                              "    num_replicas: 2\n    tool_parser: hermes\n"))
    assert (spec.name, spec.loader, spec.num_replicas, spec.tool_parser) == ("chat", common_pb2.LOADER_VLLM, 2,
                                                                            "hermes")


@pytest.mark.parametrize(("entry", "key", "words"), [
    ("    loader: llama_cpp\n", "models[0].model", "has no GGUF for llama_cpp"),
    ("    n_parallel: 4\n", "models[0].n_parallel", "a llama_cpp setting on another loader"),
    ("    loader: onnx\n", "models[0].loader", "unknown loader 'onnx'"),
    ("    tool_parser: json\n", "models[0].tool_parser", "unknown tool_parser 'json'"),
    ("    replicas: 2\n", "models[0].replicas", "unknown key"),
    ("    rate_limits: {requests_per_minute: -1}\n", "models[0].rate_limits.requests_per_minute", "an integer"),
    ("    rate_limits: {rpm: 5}\n", "models[0].rate_limits.rpm", "unknown key"),
    ("    rate_limits: 5\n", "models[0].rate_limits", "expected a mapping"),
    ("    max_ongoing_requests: 0\n", "models[0].max_ongoing_requests", "an integer >= 1"),
    ("    max_queued_requests: -1\n", "models[0].max_queued_requests", "an integer >= 0"),
    ("    stall_timeout_s: -5\n", "models[0].stall_timeout_s", "a number >= 0"),
    ("    stall_timeout_s: .inf\n", "models[0].stall_timeout_s", "got inf"),
    # YAML values of the wrong shape, each once a traceback:
    ("    loader: [vllm]\n", "models[0].loader", "unknown loader ['vllm']"),
    ("    usecase: {a: 1}\n", "models[0].usecase", "unknown usecase {'a': 1}"),
    ("    tool_parser: [hermes]\n", "models[0].tool_parser", "unknown tool_parser"),
    ("    engine_args: {seed: 2024-01-01}\n", "models[0].engine_args.seed", "a date value"),
    ("    engine_args: {x: [{y: 2024-01-01}]}\n", "models[0].engine_args.x[0].y", "a date value"),
    ("    engine_args: {x: 99999999999999999999999}\n", "models[0].engine_args.x", "past 2**53"),
    ("    num_cpus: .nan\n", "models[0].num_cpus", "a number >= 0, got nan"),
    ("    num_gpus: .inf\n", "models[0].num_gpus", "a number >= 0, got inf"),
    ("    autoscaling_config: {upscale_delay_s: .inf}\n", "models[0].autoscaling_config.upscale_delay_s", "got inf"),
])
def test_a_bad_entry_names_the_key_and_the_fix(tmp_path, entry, key, words):
    path = write(tmp_path, "models:\n  - name: chat\n    model: builtin:all-minilm-l6-v2\n" + entry)
    with pytest.raises(ConfigError) as e:
        load_model_set(path)
    assert e.value.key == key and words in e.value.problem and e.value.fix
    assert str(path) in str(e.value)


@pytest.mark.parametrize("runtime", ["[a]", "0", "false", "{}"])
def test_a_llama_runtime_that_is_not_a_name_is_refused(tmp_path, runtime):
    with pytest.raises(ConfigError) as e:
        load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: /m/x.gguf\n    loader: llama_cpp\n"
                                       f"    llama_runtime: {runtime}\n"))
    assert e.value.key == "models[0].llama_runtime"


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_bytes("models:\n  - name: chat\n    model: café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        load_model_set(path)
    assert e.value.key == "(file)" and "not UTF-8" in e.value.problem and "UTF-8" in e.value.fix


def test_the_cli_refuses_a_model_its_loader_cannot_run_before_calling_anyone():
    # 127.0.0.1:1 is never a coordinator: a config error must exit 2 before any call (3 = unreachable)
    out = subprocess.run([sys.executable, "-m", "clients.cli", "--coordinator", "127.0.0.1:1", "deploy",
                          "--model", "builtin:all-minilm-l6-v2", "--loader", "llama_cpp"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--model.model" in out.stderr and "has no GGUF" in out.stderr and "Fix:" in out.stderr


def test_rate_limits_and_llama_runtime(tmp_path):
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: /m/x.gguf\n    loader: llama_cpp\n"
                                             "    llama_runtime: in_process\n"
                                             "    rate_limits: {requests_per_minute: 60}\n"))
    assert spec.llama_cpp.runtime == "in_process"
    assert (spec.rate_limits.requests_per_minute, spec.rate_limits.tokens_per_minute) == (60, 0)
    with pytest.raises(ConfigError) as e:
        load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: /m/x.gguf\n    loader: llama_cpp\n"
                                       "    llama_runtime: thread\n"))
    assert e.value.key == "models[0].llama_runtime" and "server, in_process" in e.value.fix


def test_backpressure_limits_are_kept_as_written_and_unset_when_absent(tmp_path):
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: builtin:tiny-qwen2\n"
                                             "    max_ongoing_requests: 2\n    max_queued_requests: 0\n"))
    assert (spec.max_ongoing_requests, spec.HasField("max_queued_requests"), spec.max_queued_requests) == (2, True, 0)
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: builtin:tiny-qwen2\n"))
    assert not spec.HasField("max_ongoing_requests") and not spec.HasField("max_queued_requests")


def test_a_stall_timeout_is_kept_as_written_0_included_and_unset_when_absent(tmp_path):
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: builtin:tiny-qwen2\n"
                                             "    stall_timeout_s: 0\n"))
    assert spec.HasField("stall_timeout_s") and spec.stall_timeout_s == 0  # 0: never, not the default
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: builtin:tiny-qwen2\n"
                                             "    stall_timeout_s: 45.5\n"))
    assert spec.stall_timeout_s == 45.5
    (spec,) = load_model_set(write(tmp_path, "models:\n  - name: chat\n    model: builtin:tiny-qwen2\n"))
    assert not spec.HasField("stall_timeout_s")
